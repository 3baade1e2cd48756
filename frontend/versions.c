/* versions.c: the one table of x-transformers versions xtc mirrors and how they differ
 * (measured against the libraries themselves: ../shared/xt-newer/README.md; the parity cases
 * in tests/parity_newer pin each row down). */
#include "versions.h"

#include <stdio.h>
#include <string.h>

const XtVersion xt_versions[XT_V_NUM] = {
    [XT_V0_23] = {.name = "0.23.0", .commit = "75d723ba14103ea9664b6980c3c502b5d2700d13",
                  .token_emb = "token_emb.weight", .ff_net = "net", .ff_out_index = 3,
                  .final_norm = "norm", .final_norm_follows = 0, .layer_norm_bias = 1,
                  .ln_beta_buffer = 0, .norm_legacy_eps = 1, .unit_offset_option = 0,
                  .linear_biases = 1, .single_head_no_to_out = 0, .rotary_on_v = 1,
                  .rotary_interleaved = 0, .rotary_min_dim = 32, .mask_queries = 1,
                  .zero_padded_rows = 0, .qk_norm_fixed = 0, .qk_dim_scale_kv = 0,
                  .gate_values_bias = 1, .xl_mem_pre_norm = 0, .xl_takes_mask = 0},
    [XT_V1_29] = {.name = "1.29.2", .commit = "58fb0262d026250edc9de86e6a631e7a890de31e",
                  .token_emb = "token_emb.emb.weight", .ff_net = "ff", .ff_out_index = 2,
                  .final_norm = "attn_layers.final_norm", .final_norm_follows = 1,
                  .layer_norm_bias = 0, .ln_beta_buffer = 1, .norm_legacy_eps = 0,
                  .unit_offset_option = 0, .linear_biases = 0, .single_head_no_to_out = 0,
                  .rotary_on_v = 0, .rotary_interleaved = 0, .rotary_min_dim = 32,
                  .mask_queries = 0, .zero_padded_rows = 1, .qk_norm_fixed = 1,
                  .qk_dim_scale_kv = 0, .gate_values_bias = 1, .xl_mem_pre_norm = 1, .xl_takes_mask = 1},
    [XT_V2_26] = {.name = "2.26.4", .commit = "9252ed7838021ee61e6c5be0930b3a9a88efdf06",
                  .token_emb = "token_emb.emb.weight", .ff_net = "ff", .ff_out_index = 2,
                  .final_norm = "attn_layers.final_norm", .final_norm_follows = 1,
                  .layer_norm_bias = 0, .ln_beta_buffer = 0, .norm_legacy_eps = 0,
                  .unit_offset_option = 1, .linear_biases = 0, .single_head_no_to_out = 1,
                  .rotary_on_v = 0, .rotary_interleaved = 1, .rotary_min_dim = 0,
                  .mask_queries = 0, .zero_padded_rows = 1, .qk_norm_fixed = 1,
                  .qk_dim_scale_kv = 1, .gate_values_bias = 0, .xl_mem_pre_norm = 1, .xl_takes_mask = 1},
};

int xt_version_find(const char *s)
{
    if (!s)
        return -1;
    for (int v = 0; v < XT_V_NUM; v++) {
        const char *n = xt_versions[v].name;
        size_t len = strlen(s);
        /* the full name, or a prefix of it that ends at a dot ("2.26", "2") */
        if (strncmp(n, s, len) == 0 && len > 0 && (n[len] == '\0' || n[len] == '.'))
            return v;
    }
    return -1;
}

const char *xt_version_list(unsigned mask, char *buf, int cap)
{
    int n = 0, total = 0, len = 0;
    for (int v = 0; v < XT_V_NUM; v++)
        total += (mask & XT_V_BIT(v)) != 0;
    buf[0] = '\0';
    for (int v = 0; v < XT_V_NUM && len < cap; v++) {
        if (!(mask & XT_V_BIT(v)))
            continue;
        n++;
        int w = snprintf(buf + len, (size_t)(cap - len), "%s%s", n == 1 ? "" : n == total ? " and " : ", ",
                         xt_versions[v].name);
        len += w > 0 ? w : 0;
    }
    return buf;
}
