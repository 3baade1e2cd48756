/* xtc.c: the command line. One table of subcommands; each parses its own flags, prints its
 * --help, and reports any error as one line on stderr with a non-zero exit status. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int cmd_help(int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"compile", cli_compile, "compile a model to a shared library (model.so)"},
    {"run", cli_run, "run a model (.xtf on the interpreter, .so compiled) on .safetensors inputs"},
    {"info", cli_info, "describe a compiled module"},
    {"init", cli_init, "write fresh seeded weights for a compiled module"},
    {"quantize", cli_quantize, "write a model's weights with int8 matmul weights (for --weights-dtype int8)"},
    {"bench", cli_bench, "time a model compiled fused and unfused, kernel by kernel"},
    {"train", cli_train, "train a byte-level language model on a text file (AdamW, checkpoints)"},
    {"generate", cli_generate, "sample text from a trained model with a KV cache"},
    {"ir", cli_ir, "print the IR of a model (after lowering, or after a pass)"},
    {"check", cli_check, "parse and check a .xtf file, reporting every error"},
    {"convert", cli_convert, "convert a checkpoint between x-transformers versions (same model)"},
    {"options", cli_options, "list the constructors and options of the language, and what is supported"},
    {"demo", cli_demo_train, "train the bundled tiny GPT on generated text, then sample from it"},
    {"version", cli_version, "print the version, the commit, LLVM, and whether CUDA is available (--version, -V)"},
    {"help", cmd_help, "show this help"},
};

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("xtc: a compiler and runtime for transformer models (x-transformers in C)\n\n"
           "usage: xtc <command> [options]     (xtc <command> --help for details)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        printf("  %-10s %s\n", commands[i].name, commands[i].summary);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        cmd_help(0, NULL);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))
        return cli_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    const char *names[sizeof commands / sizeof commands[0]];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        names[i] = commands[i].name;
    const char *near = cli_nearest(argv[1], names, (int)(sizeof names / sizeof names[0]));
    if (near)
        fprintf(stderr, "xtc: unknown command '%s' (did you mean '%s'?)\n", argv[1], near);
    else
        fprintf(stderr, "xtc: unknown command '%s' (try 'xtc help')\n", argv[1]);
    return 2;
}
