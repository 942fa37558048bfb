#!/usr/bin/env bash
# Builds the libFuzzer targets for the safetensors header parser and the
# config.json parser with clang (-fsanitize=fuzzer,address,undefined),
# outside the main CMake build, and runs each for SECONDS (default 180).
# Usage: tests/fuzz/run.sh [SECONDS]        (from anywhere)
# Output: build-fuzz/ (binaries, corpora, crash-* files, logs).
set -euo pipefail
secs=${1:-180}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/build-fuzz"
mkdir -p "$out"
cc=${CC_FUZZ:-clang}
flags=(-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I "$root")
common=("$root/common/status.c" "$root/common/files.c")
"$cc" "${flags[@]}" -o "$out/fuzz_safetensors" "$root/tests/fuzz/fuzz_safetensors.c" \
    "$root/model/format/safetensors.c" "${common[@]}" -lcjson -lm
"$cc" "${flags[@]}" -o "$out/fuzz_config" "$root/tests/fuzz/fuzz_config.c" \
    "$root/model/format/config.c" "$root/model/format/quark.c" "$root/model/format/safetensors.c" "${common[@]}" -lcjson -lpcre2-8 -lm

# Seeds: small hand-made safetensors files, and GLM-style config.json files.
st="$out/corpus_safetensors"
cf="$out/corpus_config"
mkdir -p "$st" "$cf"
seed_st() { # name header
    local n=${#2}
    printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))" >"$st/$1"
    printf '%s' "$2" >>"$st/$1"
    head -c "$3" /dev/zero >>"$st/$1"
}
seed_st one '{"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}' 12
seed_st two '{"__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[4,2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[],"data_offsets":[8,12]}}' 12
seed_st mx '{"x.weight":{"dtype":"U8","shape":[2,16],"data_offsets":[0,32]},"x.weight_scale":{"dtype":"U8","shape":[2,1],"data_offsets":[32,34]},"y":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[34,37]},"z":{"dtype":"I32","shape":[1],"data_offsets":[37,41]},"h":{"dtype":"F16","shape":[1],"data_offsets":[41,43]}}' 43
seed_st empty '{}' 0
if [ ! -e "$cf/tiny.json" ]; then
    tmp=$(mktemp -d)
    if [ -x "$root/build/moetune" ] || ls "$root"/build*/moetune >/dev/null 2>&1; then
        bin=$(ls "$root"/build*/moetune | head -n 1)
        "$bin" make-tiny-model --out "$tmp" >/dev/null && cp "$tmp/config.json" "$cf/tiny.json"
    fi
    rm -rf "$tmp"
fi
cat >"$cf/min.json" <<'JSON'
{"hidden_size":64,"num_hidden_layers":3,"vocab_size":100,"max_position_embeddings":64,"rms_norm_eps":1e-5,"first_k_dense_replace":1,"intermediate_size":64,"moe_intermediate_size":32,"n_routed_experts":4,"n_shared_experts":1,"num_experts_per_tok":2,"routed_scaling_factor":2.5,"norm_topk_prob":true,"num_attention_heads":2,"q_lora_rank":16,"kv_lora_rank":8,"qk_nope_head_dim":8,"qk_rope_head_dim":4,"v_head_dim":8,"index_topk":4,"index_n_heads":1,"index_head_dim":8,"index_topk_freq":2,"index_skip_topk_offset":1,"indexer_types":["full","shared","full"],"num_nextn_predict_layers":1,"rope_parameters":{"rope_theta":10000},"eos_token_id":[1,2],"quantization_config":{"quant_method":"quark","global_quant_config":{"weight":{"dtype":"fp4","qscheme":"per_group","group_size":32,"scale_format":"e8m0"},"input_tensors":{"dtype":"fp4","qscheme":"per_group","group_size":32,"scale_format":"e8m0","is_dynamic":true}},"exclude":["*self_attn*","re:model\\.layers\\.0\\..*","*layers.3.*"],"layer_quant_config":{"*experts.1.*":{"weight":null}},"layer_type_quant_config":{"Linear":{"weight":{"dtype":"fp8_e4m3","qscheme":"per_tensor"}}}}}
JSON

run() { # target corpus dict
    local log="$out/$1.log"
    echo "== $1: ${secs}s"
    (cd "$out" && ASAN_OPTIONS=detect_leaks=1 "./$1" -max_total_time="$secs" -dict="$root/tests/fuzz/$3" \
        -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$2" >"$log" 2>&1) || {
        echo "$1 FAILED: see $log and $out/crash-*"
        tail -n 30 "$log"
        return 1
    }
    grep -E '^(stat::number_of_executed_runs|stat::new_units_added|stat::peak_rss_mb)|cov:' "$log" | tail -n 4
}
status=0
run fuzz_safetensors "$st" safetensors.dict || status=1
run fuzz_config "$cf" config.dict || status=1
bash "$root/tests/fuzz/serve_fuzz.sh" "$secs" || status=1  # the server's parsers
exit $status
