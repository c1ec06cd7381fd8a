/* tests/grad/test_internal_grad_ops.c: the randomized gradient checker draws every
 * differentiable op of the registry: each op of wf__ops_table with a gradient function is in
 * its list (tests/grad/grad_random_ops.h) or among the internal ones only gradients make, and
 * every name of the list is such an op. Links libweft.a (the table and grad/'s lookup are
 * hidden in libweft.so). */
#include "../../grad/internal.h"
#include "../../ops/table.h"
#include "grad_random_ops.h"
#include "wf_test.h"

#include <criterion/criterion.h>

#include <string.h>

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static bool listed(const char *const *list, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name))
            return true;
    return false;
}

Test(grad_internal_ops, the_random_checker_draws_every_differentiable_op_of_the_registry)
{
    int differentiable = 0;
    for (size_t i = 0; i < wf__ops_table_len; i++) {
        const wf_op_def *op = wf__ops_table[i];
        if (!wf__grad_find(op))
            continue;
        differentiable++;
        cr_assert(listed(gr_ops, LEN(gr_ops), op->name) ||
                      listed(gr_internal_ops, LEN(gr_internal_ops), op->name),
                  "op '%s' has a gradient but the random checker does not draw it", op->name);
    }
    cr_assert_eq((size_t)differentiable, LEN(gr_ops) + LEN(gr_internal_ops));
    for (size_t i = 0; i < LEN(gr_ops); i++) {
        const wf_op_def *op = wf__ops_find(gr_ops[i]);
        cr_assert(op && wf__grad_find(op), "'%s' is not a differentiable op", gr_ops[i]);
    }
}
