/* leaker.c: a program that leaks one block on purpose (`leaker leak`) or
 * frees it (`leaker free`). Built only with MOETUNE_SANITIZE;
 * test_lsan_reports runs it to prove that LeakSanitizer is on and reports
 * under the ASAN_OPTIONS the suite runs with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile sink;

/* Allocates a block and forgets it. noinline, and the stack is scrubbed
 * afterwards, so no stale copy of the pointer keeps it reachable. */
__attribute__((noinline)) static void leak_on_purpose(size_t n)
{
    char *p = malloc(n);
    if (!p)
        exit(2);
    memset(p, 0x5a, n);
    sink = p;
    sink = NULL;
}

__attribute__((noinline)) static void scrub_stack(void)
{
    volatile char pad[4096];
    memset((char *)pad, 0, sizeof pad);
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "leak") && strcmp(argv[1], "free"))) {
        fprintf(stderr, "usage: leaker leak|free\n");
        return 2;
    }
    if (!strcmp(argv[1], "leak")) {
        leak_on_purpose(4242);
    } else {
        char *p = malloc(4242);
        free(p);
    }
    scrub_stack();
    return 0;
}
