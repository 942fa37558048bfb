#!/usr/bin/env bash
# Builds the server's libFuzzer targets (request parsing, SSE parsing, the
# GLM output parser: reasoning and tool calls) with
# clang (-fsanitize=fuzzer,address,undefined) outside the CMake build, seeds
# them, and runs each for SECONDS (default 180). Called by run.sh; also runs
# alone: tests/fuzz/serve_fuzz.sh [SECONDS]. Output: build-fuzz/serve_*.
set -euo pipefail
secs=${1:-180}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/build-fuzz"
mkdir -p "$out"
cc=${CC_FUZZ:-clang}
flags=(-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I "$root")
common=("$root/common/status.c" "$root/common/files.c" "$root/common/json_depth.c")
"$cc" "${flags[@]}" -o "$out/serve_fuzz_request" "$root/tests/fuzz/serve_fuzz_request.c" \
    "$root/serve/serve_request.c" "$root/serve/serve_error.c" "$root/serve/serve_buf.c" \
    "$root/serve/serve_grammar.c" "$root/serve/serve_glmout.c" "$root/serve/serve_logits.c" \
    "$root/serve/serve_mask.c" "$root/model/format/chat.c" \
    "$root/model/format/tokenizer.c" "${common[@]}" -lcjson -lpcre2-8 -lm -lpthread
"$cc" "${flags[@]}" -o "$out/serve_fuzz_sse" "$root/tests/fuzz/serve_fuzz_sse.c" \
    "$root/serve/serve_sse.c" "$root/serve/serve_buf.c" "${common[@]}" -lm
"$cc" "${flags[@]}" -I "$root/tests/fuzz" -o "$out/serve_fuzz_glmout" \
    "$root/tests/fuzz/serve_fuzz_glmout.c" "$root/serve/serve_glmout.c" "$root/serve/serve_buf.c" \
    "${common[@]}" -lcjson -lm

rq="$out/corpus_serve_request"
ss="$out/corpus_serve_sse"
go="$out/corpus_serve_glmout"
mkdir -p "$rq" "$ss" "$go"
seed() { printf "$2" >"$rq/$1"; } # name, endpoint byte (\x00..\x03) + body
seed c1 '\x00{"prompt":"The keeper","max_tokens":8,"temperature":0.5,"stop":["x","yz"],"stream":true}'
seed c2 '\x00{"prompt":[1,2,3],"top_k":-1,"top_p":0.9,"seed":7,"ignore_eos":true,"stream_options":{"include_usage":false}}'
seed c3 '\x00{"prompt":[[4,5]],"n":1,"logprobs":null,"return_token_ids":true}'
seed h1 '\x01{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"reasoning_content":"r"}],"max_completion_tokens":5,"chat_template_kwargs":{"enable_thinking":true}}'
seed t1 '\x02{"prompt":"The baker <|user|>"}'
seed t2 '\x02{"messages":[{"role":"tool","content":"42"}],"add_generation_prompt":false}'
seed d1 '\x03{"tokens":[1,2,3,300]}'
seed deep "\x01$(printf '%.0s[' $(seq 900))"
seed s1 '\x01{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"strict":true,"schema":{"type":"object","properties":{"a":{"type":"string","maxLength":4},"b":{"enum":[1,"x",null]},"c":{"type":"array","items":{"type":["integer","null"]},"maxItems":2},"d":{"anyOf":[{"type":"string"},{"type":"object","properties":{"e":{"type":"boolean"}}}]}},"required":["a","b"],"additionalProperties":false}}},"logit_bias":{"5":-3.5},"min_p":0.1,"presence_penalty":0.5,"frequency_penalty":-1,"repetition_penalty":1.2}'
seed s2 '\x01{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"q":{"type":"string","minLength":1},"n":{"type":"integer"},"o":{"type":"object","additionalProperties":{"type":"number"}}},"required":["q"]}}}],"tool_choice":"required","parallel_tool_calls":false,"chat_template_kwargs":{"enable_thinking":true}}'
seed s3 '\x00{"prompt":"x","response_format":{"type":"json_object"},"logit_bias":{"1":100,"2":-100}}'
seed s4 '\x01{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"g"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}'
printf '\x05data: {"a":1}\n\ndata: [DONE]\n\n' >"$ss/s1"
printf '\x01: c\r\nevent: x\r\ndata:one\r\ndata: two\r\r\n\ndata\n\n' >"$ss/s2"
# flags byte (1: starts in reasoning, 2: keep reasoning), split byte, text.
printf '\x00\x03Hi<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>' >"$go/g47"
printf '\x01\x05plan</think>ok<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x y</arg_value>\n<arg_key>filters</arg_key>\n<arg_value>{"a":[1]}</arg_value>\n</tool_call><tool_call>noargs</tool_call>' >"$go/g45"
printf '\x00\x07<think>r</think><tool_call>nope<arg_key>a</arg_key></tool_call>tail<tool_call>get_weather<arg_key>metric' >"$go/bad"
tok="$out/serve_tokenizer.json"
if [ ! -e "$tok" ]; then
    bin=$(ls "$root"/build*/moetune 2>/dev/null | head -n 1 || true)
    if [ -n "$bin" ]; then
        tmp=$(mktemp -d)
        "$bin" make-tiny-model --out "$tmp" >/dev/null && cp "$tmp/tokenizer.json" "$tok"
        rm -rf "$tmp"
    fi
fi
[ -e "$tok" ] && export MT_FUZZ_TOKENIZER="$tok"

run() { # target corpus [dict]
    local log="$out/$1.log" dict=()
    [ -n "${3:-}" ] && dict=(-dict="$root/tests/fuzz/$3")
    echo "== $1: ${secs}s${MT_FUZZ_TOKENIZER:+ (with the tiny tokenizer)}"
    (cd "$out" && ASAN_OPTIONS=detect_leaks=1 "./$1" -max_total_time="$secs" "${dict[@]}" \
        -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$2" >"$log" 2>&1) || {
        echo "$1 FAILED: see $log and $out/crash-*"
        tail -n 30 "$log"
        return 1
    }
    grep -E '^(stat::number_of_executed_runs|stat::new_units_added|stat::peak_rss_mb)|cov:' "$log" | tail -n 4
}
status=0
run serve_fuzz_request "$rq" serve_request.dict || status=1
run serve_fuzz_sse "$ss" || status=1
run serve_fuzz_glmout "$go" serve_glmout.dict || status=1
exit $status
