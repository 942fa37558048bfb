/* fuzz_safetensors.c: libFuzzer target for the safetensors header parser
 * (model_st_open_memory). Every accepted file must describe tensors that
 * lie inside the buffer; the target reads each tensor's first and last
 * byte so AddressSanitizer sees any pointer past the end. Built by run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy, so a read past the end hits ASan's redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    model_st_file *f = NULL;
    mt_err err = MT_ERR_INIT;
    if (model_st_open_memory("fuzz.safetensors", buf, size, &f, &err) == MT_OK) {
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < model_st_count(f); i++) {
            const model_tensor_info *t = model_st_at(f, i);
            if (t->offset + t->nbytes > size || model_st_find(f, t->name) != t)
                abort();
            if (t->nbytes) {
                sink ^= ((const uint8_t *)t->data)[0];
                sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            }
            char d[128];
            model_tensor_describe(t, d, sizeof d);
        }
        (void)model_st_metadata(f, "format");
        (void)sink;
        model_st_close(f);
    } else if (!strstr(err.msg, "fuzz.safetensors")) {
        abort(); /* every error names the file */
    }
    free(buf);
    return 0;
}
