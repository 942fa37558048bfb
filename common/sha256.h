/* sha256.h: SHA-256, used for compile-cache keys and kernel source hashes.
 * The context is caller-owned plain data. */
#ifndef MT_SHA256_H
#define MT_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct mt_sha256 {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t fill;
} mt_sha256;

void mt_sha256_init(mt_sha256 *c);
void mt_sha256_update(mt_sha256 *c, const void *data, size_t n);
/* Adds a string and its terminating NUL, so ("ab","c") != ("a","bc"). */
void mt_sha256_update_str(mt_sha256 *c, const char *s);
void mt_sha256_final(mt_sha256 *c, uint8_t out[32]);
/* Lower-case hex of the digest of the whole context so far into hex[65]. */
void mt_sha256_hex(mt_sha256 *c, char hex[65]);
/* One-shot hex digest of a buffer. */
void mt_sha256_hex_of(const void *data, size_t n, char hex[65]);

#endif
