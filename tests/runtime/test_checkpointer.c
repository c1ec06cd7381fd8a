/* tests/runtime/test_checkpointer.c: checkpoints every K steps through the public API
 * (wf_checkpointer_*, wf_checkpoint_latest, wf_checkpoint_restore): a snapshot holds the
 * values of its step even when training goes on before the background write; the newest
 * 'keep' files are kept; the newest complete one is found, skipping garbage, a file whose
 * name and step disagree and temporary files; a restore gives back the variables bitwise,
 * the step and the extras; a background write that fails is reported by the next call and
 * loses nothing already saved; bad arguments and folders are refused with messages. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void setup(void)
{
    wf_test_rt_setup();
    snprintf(dir, sizeof dir, "/tmp/wf-ckptr-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    wf_test_rm_dir(dir);
    wf_test_rt_teardown();
}

TestSuite(runtime_checkpointer, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

/* A tiny training problem: w [4, 3] and b [3], loss mean((x w + b)^2), Adam, so the file
 * holds the weights, two moments each and a step counter. */
typedef struct problem {
    wf_graph *g;
    wf_session *s;
    wf_node *x, *w, *b, *loss, *train;
    wf_tensor *xs;
} problem;

static void problem_make(problem *p)
{
    p->g = wf_graph_create(rt, WF_STATIC);
    p->x = wf_placeholder(p->g, "x", WF_F32, WF_SHAPE(2, 4));
    p->w = wf_variable(p->g, "w", WF_F32, WF_SHAPE(4, 3), wf_init_uniform(7, -1, 1));
    p->b = wf_variable(p->g, "b", WF_F32, WF_SHAPE(3), wf_init_uniform(8, -1, 1));
    wf_node *h = wf_add(p->g, wf_matmul(p->g, p->x, p->w), p->b);
    p->loss = wf_mean(p->g, wf_mul(p->g, h, h));
    p->train = wf_minimize(p->g, wf_adam(1e-2), p->loss);
    cr_assert_eq(wf_graph_status(p->g), 0, "%s", wf_graph_errmsg(p->g));
    p->s = wf_test_session(p->g, 0);
    static const float xd[8] = { 1, -2, 0.5f, 3, -1, 0.25f, 2, -0.5f };
    p->xs = wf_test_f32(WF_SHAPE(2, 4), xd);
}

static void problem_step(problem *p)
{
    wf_feed f = { p->x, p->xs };
    wf_test_run(p->s, &f, 1, NULL, 0, NULL, &p->train, 1);
}

static void problem_free(problem *p)
{
    wf_tensor_release(p->xs);
    wf_session_destroy(p->s);
    wf_graph_destroy(p->g);
}

/* The bytes of every variable of 's' (in node order) into a new buffer; '*n' its size. */
static unsigned char *var_bytes(wf_graph *g, wf_session *s, size_t *n)
{
    unsigned char *buf = NULL;
    *n = 0;
    for (int i = 0; i < wf_graph_node_count(g); i++) {
        wf_node *v = wf_graph_node(g, i);
        if (strcmp(wf_node_op(v), "variable") != 0)
            continue;
        wf_tensor *t = NULL;
        cr_assert_eq(wf_session_variable(s, v, &t), 0);
        size_t nb = (size_t)wf_tensor_numel(t) * wf_dtype_size(wf_tensor_dtype(t));
        buf = realloc(buf, *n + nb);
        memcpy(buf + *n, wf_tensor_data(t), nb);
        *n += nb;
        wf_tensor_release(t);
    }
    return buf;
}

static int count_checkpoints(void)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, "ckpt-", 5) == 0;
    closedir(d);
    return n;
}

static wf_checkpointer *checkpointer(int keep)
{
    wf_checkpointer *c = NULL;
    int rc = wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = dir, .keep = keep }, &c);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    return c;
}

Test(runtime_checkpointer, a_snapshot_holds_its_steps_values_while_training_goes_on)
{
    problem p, q;
    problem_make(&p);
    problem_make(&q);
    wf_checkpointer *c = checkpointer(2);
    unsigned char *at[6] = { 0 };
    size_t n_at = 0;
    int64_t pos[1] = { 0 };
    for (int step = 1; step <= 5; step++) {
        problem_step(&p);
        at[step] = var_bytes(p.g, p.s, &n_at);
        pos[0] = 1000 + step;
        wf_tensor *extra = wf_tensor_from(WF_I64, WF_SHAPE(1), pos);
        wf_named_tensor ex = { "data.position", extra };
        int rc = wf_checkpointer_save(c, p.s, step, &ex, 1);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
        wf_tensor_release(extra);
        /* the next steps run before the write has surely finished: its values must not
         * leak into the snapshot */
    }
    problem_step(&p);
    cr_assert_eq(wf_checkpointer_wait(c), 0, "%s", wf_last_errmsg());
    wf_checkpointer_destroy(c);
    cr_assert_eq(count_checkpoints(), 2, "keep 2: the newest two stay");

    char path[512];
    int64_t step = -1;
    int rc = wf_checkpoint_latest(dir, path, sizeof path, &step);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(step, 5);
    cr_assert(strstr(path, "ckpt-000000000005.safetensors"), "%s", path);

    wf_named_tensor *extra = NULL;
    int n_extra = -1;
    int64_t got = -1;
    rc = wf_checkpoint_restore(q.s, path, &got, &extra, &n_extra);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(q.s));
    cr_assert_eq(got, 5);
    cr_assert_eq(n_extra, 1);
    cr_assert_str_eq(extra[0].name, "data.position");
    cr_assert_eq(wf_tensor_data_i64(extra[0].tensor)[0], 1005);
    wf_safetensors_free(extra, n_extra);
    size_t nq;
    unsigned char *qb = var_bytes(q.g, q.s, &nq);
    cr_assert_eq(nq, n_at);
    cr_assert(memcmp(qb, at[5], nq) == 0, "the restored variables are step 5's, bitwise");
    /* and the restored session trains on exactly as the original did */
    problem_step(&q);
    size_t np;
    unsigned char *pb = var_bytes(p.g, p.s, &np);
    free(qb);
    qb = var_bytes(q.g, q.s, &nq);
    cr_assert(memcmp(qb, pb, nq) == 0, "step 6 after the restore equals step 6 uninterrupted");
    free(qb);
    free(pb);
    for (int i = 1; i <= 5; i++)
        free(at[i]);
    problem_free(&p);
    problem_free(&q);
}

Test(runtime_checkpointer, latest_skips_garbage_a_renamed_file_and_temporaries)
{
    problem p;
    problem_make(&p);
    char path[512], want[512];
    int64_t step;
    cr_assert_eq(wf_checkpoint_latest(dir, path, sizeof path, &step), WF_ENOTFOUND);
    cr_assert(strstr(wf_last_errmsg(), "no complete checkpoint"), "%s", wf_last_errmsg());
    wf_checkpointer *c = checkpointer(0);
    for (int s = 1; s <= 3; s++) {
        problem_step(&p);
        cr_assert_eq(wf_checkpointer_save(c, p.s, 100 * s, NULL, 0), 0, "%s", wf_last_errmsg());
    }
    cr_assert_eq(wf_checkpointer_wait(c), 0, "%s", wf_last_errmsg());
    wf_checkpointer_destroy(c);
    /* newer names: garbage, a temporary a killed save left, a copy of step 300 named 900 */
    snprintf(path, sizeof path, "%s/ckpt-000000000800.safetensors", dir);
    FILE *f = fopen(path, "w");
    fputs("not a checkpoint", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/ckpt-000000000850.safetensors.tmp.1.1", dir);
    f = fopen(path, "w");
    fclose(f);
    snprintf(want, sizeof want, "%s/ckpt-000000000300.safetensors", dir);
    snprintf(path, sizeof path, "%s/ckpt-000000000900.safetensors", dir);
    cr_assert_eq(link(want, path), 0, "%s", strerror(errno));
    int rc = wf_checkpoint_latest(dir, path, sizeof path, &step);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(step, 300);
    cr_assert_str_eq(path, want);
    cr_assert_eq(wf_checkpoint_latest(dir, path, 8, &step), WF_EINVAL, "a buffer too small");
    cr_assert_eq(wf_checkpoint_latest("/nonexistent/weft", path, sizeof path, &step), WF_ENOTFOUND);
    problem_free(&p);
}

Test(runtime_checkpointer, a_failed_background_write_is_reported_next_and_loses_nothing)
{
    problem p;
    problem_make(&p);
    wf_checkpointer *c = checkpointer(1);
    problem_step(&p);
    cr_assert_eq(wf_checkpointer_save(c, p.s, 1, NULL, 0), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_checkpointer_wait(c), 0, "%s", wf_last_errmsg());
    /* step 2's file cannot be renamed into place: a folder has its name */
    char blocker[512];
    snprintf(blocker, sizeof blocker, "%s/ckpt-000000000002.safetensors", dir);
    cr_assert_eq(mkdir(blocker, 0700), 0);
    problem_step(&p);
    cr_assert_eq(wf_checkpointer_save(c, p.s, 2, NULL, 0), 0, "the write fails later");
    problem_step(&p);
    int rc = wf_checkpointer_save(c, p.s, 3, NULL, 0);
    cr_assert_eq(rc, WF_EIO, "the next call reports it: %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "checkpoint of step 2") &&
                  strstr(wf_last_errmsg(), "ckpt-000000000002.safetensors"),
              "the message names the step and the file: %s", wf_last_errmsg());
    cr_assert_eq(wf_checkpointer_wait(c), 0, "reported once, then cleared");
    char path[512];
    int64_t step;
    cr_assert_eq(wf_checkpoint_latest(dir, path, sizeof path, &step), 0, "%s", wf_last_errmsg());
    cr_assert_eq(step, 1, "step 1's checkpoint is still there and complete");
    cr_assert_eq(rmdir(blocker), 0);
    cr_assert_eq(wf_checkpointer_save(c, p.s, 3, NULL, 0), 0, "and the next save works");
    cr_assert_eq(wf_checkpointer_wait(c), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_checkpoint_latest(dir, path, sizeof path, &step), 0);
    cr_assert_eq(step, 3);
    cr_assert_eq(count_checkpoints(), 1, "keep 1");
    wf_checkpointer_destroy(c);
    problem_free(&p);
}

Test(runtime_checkpointer, restore_refuses_a_file_without_a_step_and_changes_nothing)
{
    problem p;
    problem_make(&p);
    problem_step(&p);
    char path[512];
    snprintf(path, sizeof path, "%s/plain.safetensors", dir);
    cr_assert_eq(wf_checkpoint_save(p.s, path), 0);
    problem_step(&p);
    size_t n0, n1;
    unsigned char *before = var_bytes(p.g, p.s, &n0);
    wf_named_tensor *extra = (wf_named_tensor *)1;
    int n_extra = 5;
    int64_t step = -1;
    int rc = wf_checkpoint_restore(p.s, path, &step, &extra, &n_extra);
    cr_assert_eq(rc, WF_EFORMAT, "%s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(p.s), "weft.step"), "%s", wf_session_errmsg(p.s));
    cr_assert_null(extra);
    cr_assert_eq(n_extra, 0);
    unsigned char *after = var_bytes(p.g, p.s, &n1);
    cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the variables are as they were");
    free(before);
    free(after);
    cr_assert_eq(wf_checkpoint_restore(p.s, path, NULL, &extra, &n_extra), WF_EINVAL);
    problem_free(&p);
}

Test(runtime_checkpointer, bad_arguments_and_folders_are_refused_with_a_message)
{
    problem p;
    problem_make(&p);
    wf_checkpointer *c = (wf_checkpointer *)1;
    cr_assert_eq(wf_checkpointer_create(NULL, &c), WF_EINVAL);
    cr_assert_null(c);
    cr_assert_eq(wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = "" }, &c), WF_EINVAL);
    cr_assert_eq(wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = dir, .keep = -1 }, &c),
                 WF_EINVAL);
    cr_assert_eq(wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = "/nonexistent/w" }, &c),
                 WF_ENOTFOUND);
    cr_assert(strstr(wf_last_errmsg(), "/nonexistent/w"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = "/dev/null" }, &c), WF_EIO);
    cr_assert(strstr(wf_last_errmsg(), "not a folder"), "%s", wf_last_errmsg());
    c = checkpointer(0);
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(3), NULL);
    wf_named_tensor clash = { "w", t }, twice[2] = { { "a", t }, { "a", t } };
    cr_assert_eq(wf_checkpointer_save(c, p.s, 1, &clash, 1), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "'w' has the name of a variable"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_checkpointer_save(c, p.s, 1, twice, 2), WF_EINVAL);
    cr_assert_eq(wf_checkpointer_save(c, p.s, -1, NULL, 0), WF_EINVAL);
    cr_assert_eq(wf_checkpointer_save(c, p.s, 1000000000000000000ll, NULL, 0), WF_EINVAL,
                 "a step of 19 digits could not be read back");
    cr_assert_eq(wf_checkpointer_save(c, p.s, 1, NULL, 1), WF_EINVAL);
    cr_assert_eq(wf_checkpointer_save(NULL, p.s, 1, NULL, 0), WF_EINVAL);
    cr_assert_eq(wf_checkpointer_wait(NULL), WF_EINVAL);
    /* without a session: the extras alone (an eager program's variables) */
    wf_named_tensor one = { "only", t };
    cr_assert_eq(wf_checkpointer_save(c, NULL, 7, &one, 1), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_checkpointer_wait(c), 0, "%s", wf_last_errmsg());
    wf_checkpointer_destroy(c);
    wf_checkpointer_destroy(NULL);
    wf_tensor_release(t);
    cr_assert_eq(count_checkpoints(), 1, "only the extras-only save wrote a file");
    problem_free(&p);
}
