/* fuzz/fuzz_checkpoint.c: libFuzzer target for wf_checkpoint_load (runtime/checkpoint.c) into
 * a session with a few variables of different dtypes and shapes, strict and with both
 * ALLOW_ flags (chosen by the input's last byte's low 2 bits), and, when bit 2 of that byte
 * is set, for wf_checkpoint_restore instead (a checkpointer's file: the "weft.step" metadata
 * and the extras). A refused load must leave every variable bitwise as it was; a restore
 * that succeeds returns a step >= 0 and extras that are not variables. One runtime, graph and
 * session for the whole run. */
#include "fuzz_util.h"

#include <weft/weft.h>

#include <string.h>

#define N_VARS 5
static const char *names[N_VARS] = { "fc1.weight", "fc1.bias", "step", "mask", "half" };
static wf_runtime *rt;
static wf_graph *g;
static wf_session *s;
static wf_node *vars[N_VARS];

static void setup(void)
{
    if (wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN }))
        abort();
    g = wf_graph_create(rt, WF_STATIC);
    vars[0] = wf_variable(g, names[0], WF_F32, WF_SHAPE(2, 3), wf_init_constant(1));
    vars[1] = wf_variable(g, names[1], WF_F32, WF_SHAPE(3), wf_init_constant(2));
    vars[2] = wf_variable(g, names[2], WF_I64, WF_SCALAR, wf_init_zeros());
    vars[3] = wf_variable(g, names[3], WF_BOOL, WF_SHAPE(4), wf_init_zeros());
    vars[4] = wf_variable(g, names[4], WF_F16, WF_SHAPE(2), wf_init_zeros());
    for (int i = 0; i < N_VARS; i++)
        if (!vars[i])
            abort();
    if (wf_session_create(g, NULL, &s))
        abort();
}

/* Copies every variable's bytes into 'buf' (large enough); returns the byte count. */
static size_t snapshot(uint8_t *buf)
{
    size_t off = 0;
    for (int i = 0; i < N_VARS; i++) {
        wf_tensor *t = NULL;
        if (wf_session_variable(s, vars[i], &t) || !t)
            abort();
        size_t nb = (size_t)wf_tensor_numel(t) * wf_dtype_size(wf_tensor_dtype(t));
        memcpy(buf + off, wf_tensor_data(t), nb);
        off += nb;
        wf_tensor_release(t);
    }
    return off;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!s)
        setup();
    uint32_t flags = size ? data[size - 1] & 3u : 0;
    char path[64];
    int fd = wf_fuzz_file(data, size, path, sizeof path);
    uint8_t before[256], after[256];
    size_t nb = snapshot(before);
    int rc;
    if (size && (data[size - 1] & 4u)) {
        int64_t step = -1;
        wf_named_tensor *extra = NULL;
        int n_extra = -1;
        rc = wf_checkpoint_restore(s, path, &step, &extra, &n_extra);
        if (rc == 0) {
            if (step < 0 || n_extra < 0 || !extra)
                abort(); /* a success without its step or extras */
            for (int i = 0; i < n_extra; i++)
                for (int k = 0; k < N_VARS; k++)
                    if (strcmp(extra[i].name, names[k]) == 0)
                        abort(); /* a variable returned as an extra */
        } else if (extra || n_extra != 0) {
            abort(); /* a refusal that returned something */
        }
        wf_safetensors_free(extra, n_extra > 0 ? n_extra : 0);
    } else {
        rc = wf_checkpoint_load(s, path, flags);
    }
    if (rc != 0) {
        if (!wf_session_errmsg(s)[0] && !wf_last_errmsg()[0])
            abort(); /* a refusal without a message */
        if (snapshot(after) != nb || memcmp(before, after, nb))
            abort(); /* a refused load changed a variable */
    }
    close(fd);
    return 0;
}
