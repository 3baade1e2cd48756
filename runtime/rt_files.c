/* rt_files.c: running a module on files: weights and inputs from .safetensors, outputs to
 * .safetensors (xtc_run_files, what `xtc run` does). */
#include "safetensors.h"
#include "rt_alloc.h"
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>

static RtDType st_dtype(XtcDType t)
{
    switch (t) {
    case XTC_F32: return RT_F32;
    case XTC_I32: return RT_I32;
    case XTC_I64: return RT_I64;
    case XTC_BOOL: return RT_BOOL;
    case XTC_I8: return RT_I8;
    default: return RT_F32;
    }
}

/* Converts one input tensor from the file into the dtype the module wants and binds it. */
static int bind_input(XtcSession *s, const XtcTensorInfo *info, const RtStTensor *t, char *err, size_t errlen)
{
    int64_t n = rt_st_numel(t);
    void *data = rt_malloc(n ? (size_t)n * 8 : 8);
    if (!data) {
        rt_set_error(err, errlen, "out of memory reading input '%s'", info->name);
        return XTC_ERR_MEMORY;
    }
    char msg[512];
    XtcDType dt = info->dtype;
    int st = 0;
    if (info->dtype == XTC_F32) {
        st = rt_st_to_f32(t, data, msg, sizeof msg);
    } else {
        st = rt_st_to_i64(t, data, msg, sizeof msg);
        if (!st && info->dtype == XTC_BOOL) {
            for (int64_t i = 0; i < n; i++)
                ((uint8_t *)data)[i] = ((int64_t *)data)[i] != 0;
        } else {
            dt = XTC_I64;
        }
    }
    if (st) {
        free(data);
        rt_set_error(err, errlen, "input '%s': %s (the module wants %s)", info->name, msg,
                     xtc_dtype_name(info->dtype));
        return XTC_ERR_SHAPE;
    }
    st = xtc_session_set_input(s, info->name, dt, t->rank, t->shape, data);
    free(data);
    if (st)
        rt_set_error(err, errlen, "%s", xtc_session_error(s));
    return st;
}

int xtc_run_files(const char *module_path, const char *weights_path, const char *input_path,
                  const char *output_path, const XtcRunOptions *opts, char *err, size_t errlen)
{
    if (!module_path || !weights_path || !input_path || !output_path) {
        rt_set_error(err, errlen, "xtc_run_files: a path is missing");
        return XTC_ERR_ARG;
    }
    XtcModule *m = NULL;
    XtcSession *s = NULL;
    RtStFile *in = NULL;
    RtStWriter *w = NULL;
    char msg[512];
    int st = xtc_module_load(module_path, &m);
    if (st) {
        rt_set_error(err, errlen, "%s", m ? xtc_module_error(m) : "out of memory");
        goto done;
    }
    XtcSessionOptions so = {.threads = opts ? opts->threads : 1};
    st = xtc_session_new(m, &so, &s);
    if (st) {
        rt_set_error(err, errlen, "%s", s ? xtc_session_error(s) : "out of memory");
        goto done;
    }
    if ((st = xtc_session_load_weights(s, weights_path))) {
        rt_set_error(err, errlen, "%s", xtc_session_error(s));
        goto done;
    }
    if ((st = rt_st_open(input_path, &in, msg, sizeof msg))) {
        rt_set_error(err, errlen, "%s", msg);
        st = st == RT_ST_EIO ? XTC_ERR_IO : st == RT_ST_ENOMEM ? XTC_ERR_MEMORY : XTC_ERR_FORMAT;
        goto done;
    }
    for (int i = 0; i < rt_st_count(in); i++) {
        const RtStTensor *t = rt_st_get(in, i);
        if (xtc_module_find(m, XTC_INPUT, t->name) < 0) {
            char names[400] = "";
            size_t len = 0;
            for (int k = 0; k < xtc_module_count(m, XTC_INPUT) && len < sizeof names; k++) {
                XtcTensorInfo info;
                xtc_module_tensor(m, XTC_INPUT, k, &info);
                len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? ", " : "", info.name);
            }
            rt_set_error(err, errlen, "%s: tensor '%s' is not an input of the model (its inputs: %s)", input_path,
                         t->name, names);
            st = XTC_ERR_NAME;
            goto done;
        }
    }
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo info;
        xtc_module_tensor(m, XTC_INPUT, i, &info);
        const RtStTensor *t = rt_st_find(in, info.name);
        if (!t && !strcmp(info.name, XTC_LOSS_SCALE_INPUT) && info.rank == 0)
            continue; /* an fp16 training module's loss scale: the session binds it */
        if (!t && !strcmp(info.name, "targets"))
            continue; /* a training module's forward pass: the outputs but loss and gradients */
        if (!t) {
            rt_set_error(err, errlen, "%s: the model's input '%s' is missing", input_path, info.name);
            st = XTC_ERR_NAME;
            goto done;
        }
        if ((st = bind_input(s, &info, t, err, errlen)))
            goto done;
    }
    if ((st = xtc_session_run(s))) {
        rt_set_error(err, errlen, "%s", xtc_session_error(s));
        goto done;
    }
    w = rt_st_writer_new();
    if (!w) {
        rt_set_error(err, errlen, "out of memory");
        st = XTC_ERR_MEMORY;
        goto done;
    }
    for (int i = 0; i < xtc_module_count(m, XTC_OUTPUT); i++) {
        XtcTensorInfo info;
        XtcTensor t;
        xtc_module_tensor(m, XTC_OUTPUT, i, &info);
        if (rt_session_withheld(s, i))
            continue; /* loss and gradients of a run without targets */
        if ((st = xtc_session_get_output(s, info.name, &t))) {
            rt_set_error(err, errlen, "%s", xtc_session_error(s));
            goto done;
        }
        rt_st_writer_add(w, info.name, st_dtype(t.dtype), t.rank, t.shape, t.data);
    }
    rt_st_writer_meta(w, "producer", "xtc");
    int rc = rt_st_writer_save(w, output_path, msg, sizeof msg);
    if (rc) {
        rt_set_error(err, errlen, "%s", msg);
        st = rc == RT_ST_ENOMEM ? XTC_ERR_MEMORY : XTC_ERR_IO;
    }
done:
    rt_st_writer_free(w);
    rt_st_close(in);
    xtc_session_free(s);
    xtc_module_free(m);
    return st;
}
