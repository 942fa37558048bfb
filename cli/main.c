/* main.c: the `moetune` command: dispatches to a subcommand by name. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *help;
} commands[] = {
    {"devices", cmd_devices, "list the devices this build can open and their properties"},
    {"kernels", cmd_kernels, "list kernel families, their shapes, parameters and space sizes"},
    {"check", cmd_check, "run kernels against their C references on a device"},
    {"db", cmd_db, "inspect, export, import, merge and clean a tuning database"},
    {"tune", cmd_tune, "search, verify and time kernel configs; store winners in the database"},
    {"make-tiny-model", cmd_make_tiny_model, "write a small random GLM-5 checkpoint in the real MXFP4 format"},
    {"isa", cmd_isa, "compile one kernel config for a GPU arch: registers, scratch, occupancy, instruction mix"},
    {"plan", cmd_plan, "memory per rank of a multi-device deployment, from config.json alone"},
    {"bench", cmd_bench, "benchmark kernels against limits measured in the same run (--family moe)"},
    {"serve", cmd_serve, "serve a checkpoint over HTTP with OpenAI's API (continuous batching, prefix cache)"},
    {"bench-serve", cmd_bench_serve, "measure a running server: Poisson load, TTFT, inter-token latency, knee"},
    {"generate", cmd_generate, "run a GLM-5 checkpoint: prompt in, sampled tokens out"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: moetune <command> [options]\n\ncommands:\n");
    for (int i = 0; commands[i].name; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`moetune <command> --help` describes a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moetune %s\n", MOETUNE_VERSION);
        return CLI_OK;
    }
    for (int i = 0; commands[i].name; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "moetune: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
