/* kvtier.c - the kvtier command: finds the subcommand named on the command
 * line and runs it. Subcommands live one per file and, like everything in
 * tools/, use only the public header include/kvtier.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "util.h"

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  void (*usage)(FILE *f);
  const char *summary;
} command;

/* Listed only once they work: later ones (warm, plan, calibrate, train,
 * eval) are added here as they are written. */
static const command commands[] = {
    {"demo", cmd_demo, demo_usage,
     "run agents that share a system prompt through the engine; show what it stored"},
    {"bench", cmd_bench, bench_usage,
     "measure sharing (bench share), hot-tier speed (bench hot), the warm codecs' speed\n"
     "           and error (bench codec), the cold tier against the raw disk (bench cold),\n"
     "           the reference decoder with kvtier against a plain cache (bench refmodel)"},
    {"warm", cmd_warm, warm_usage,
     "compute the KV of prompts with the reference model and store it durably"},
    {"import", cmd_import, import_usage,
     "store KV another engine computed (safetensors) for given token ids, durably"},
    {"plan", cmd_plan, plan_usage,
     "capacity planning: what fits in each tier, and the prefix-hit rate a trace gets\n"
     "           replayed through the engine's own eviction (--sweep over cold capacities)"},
    {"eval", cmd_eval, eval_usage,
     "the reference model's loss with a policy, budget or codec against the full cache"},
    {"train", cmd_train, train_usage,
     "fit the learned scorer's predictor to full-cache attention traces"},
    {"calibrate", cmd_calibrate, calibrate_usage,
     "a per-layer policy profile (scorer and budget share) from attention traces"},
    {"stat", cmd_stat, stat_usage,
     "what a store holds: namespaces, tiers, cold segments (read-only, beside a writer)"},
    {"fsck", cmd_fsck, fsck_usage,
     "check every cold-tier record against the index; --repair removes broken ones;\n"
     "           --rebuild-index makes a lost or damaged index again from the segments"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const command *find_command(const char *name)
{
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

static void usage(FILE *f)
{
  fprintf(f, "usage: kvtier <command> [options]\n\n"
             "kvtier stores the key/value cache of transformer models in tiers and keeps\n"
             "one copy of each block however many agents use it.\n\ncommands:\n");
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "  %-8s %s\n", "help", "this text, or a command's: kvtier help <command>");
  fprintf(f, "\nEvery command that reports figures takes --json. Exit status: 0 done,\n"
             "1 a library call or a check failed, 2 bad command line.\n");
}

static int help(int argc, char **argv)
{
  if (argc < 2) {
    usage(stdout);
    return CLI_OK;
  }
  const command *c = find_command(argv[1]);
  if (c == NULL) {
    fprintf(stderr, "kvtier help: no command '%s'; run 'kvtier help' for the list\n", argv[1]);
    return CLI_USAGE;
  }
  c->usage(stdout);
  return CLI_OK;
}

/* Output that cannot be written is a failure, not a silent success. */
static int finish(int rc)
{
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "kvtier: writing the output: %s\n", strerror(errno));
    return rc == CLI_OK ? CLI_FAIL : rc;
  }
  return rc;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  const char *name = argv[1];
  if (strcmp(name, "help") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0)
    return finish(help(argc - 1, argv + 1));
  if (strcmp(name, "--version") == 0) {
    printf("kvtier %d.%d.%d\n", KVT_VERSION_MAJOR, KVT_VERSION_MINOR, KVT_VERSION_PATCH);
    return finish(CLI_OK);
  }
  const command *c = find_command(name);
  if (c == NULL) {
    fprintf(stderr, "kvtier: unknown command '%s'; run 'kvtier help' for the list\n", name);
    return CLI_USAGE;
  }
  return finish(c->run(argc - 1, argv + 1));
}
