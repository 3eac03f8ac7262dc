/* cmds.h - the subcommands of the kvtier command, one file each. A command
 * gets the arguments after "kvtier" (argv[0] is its own name) and returns
 * the exit status: CLI_OK, CLI_FAIL or CLI_USAGE (util.h). */
#ifndef KVT_TOOLS_CMDS_H
#define KVT_TOOLS_CMDS_H

#include <stdio.h>

int cmd_demo(int argc, char **argv);  /* demo.c */
void demo_usage(FILE *f);
int cmd_bench(int argc, char **argv); /* bench.c: share, hot; codec below */
void bench_usage(FILE *f);
int bench_codec(int argc, char **argv); /* bench_codec.c: `kvtier bench codec` */
void bench_codec_usage(FILE *f);      /* its part of bench_usage() */
int bench_cold(int argc, char **argv); /* bench_cold.c: `kvtier bench cold` */
void bench_cold_usage(FILE *f);       /* its part of bench_usage() */
int bench_refmodel(int argc, char **argv); /* bench_refmodel.c: `kvtier bench refmodel` */
void bench_refmodel_usage(FILE *f);   /* its part of bench_usage() */
int bench_policy(int argc, char **argv); /* bench_policy.c: `kvtier bench policy` */
int bench_remote(int argc, char **argv); /* bench_remote.c: `kvtier bench remote` */
void bench_policy_usage(FILE *f);     /* its part of bench_usage() */
int cmd_warm(int argc, char **argv);  /* warm.c */
void warm_usage(FILE *f);
int cmd_eval(int argc, char **argv);  /* eval.c */
void eval_usage(FILE *f);
int cmd_train(int argc, char **argv); /* train.c */
void train_usage(FILE *f);
int cmd_plan(int argc, char **argv);  /* plan.c */
void plan_usage(FILE *f);
int cmd_stat(int argc, char **argv);  /* stat.c */
void stat_usage(FILE *f);
int cmd_fsck(int argc, char **argv);  /* stat.c */
void fsck_usage(FILE *f);
int cmd_import(int argc, char **argv); /* import.c */
void import_usage(FILE *f);
int cmd_calibrate(int argc, char **argv); /* calibrate.c */
void calibrate_usage(FILE *f);
int calibrate_nll(int argc, char **argv); /* calibrate_nll.c: --objective nll */
void calibrate_nll_usage(FILE *f);        /* its part of calibrate_usage() */

#endif
