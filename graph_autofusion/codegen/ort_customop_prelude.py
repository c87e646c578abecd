"""The C side of the generated custom operators that is the same for every library: the
onnxruntime C API plumbing, the kernel descriptor, the view programs, the shape checks and
the call (:data:`PRELUDE`); :mod:`graph_autofusion.codegen.ort_customop_c` appends each
library's kernels and descriptors to it."""

from __future__ import annotations

PRELUDE = r"""
/* ---- onnxruntime custom operators (graph-autofusion) ---- */
#include <stdio.h>
#include <limits.h>
#include "onnxruntime_c_api.h"

#define GAF_MAXD 12
#define GAF_MAXP 64
typedef void (*gaf_fn)(const int64_t *, void *const *, const int64_t *, int64_t);

typedef struct {
    const char *name;
    gaf_fn fast, generic;
    int rank, nred, nin, nout, nbranch;
    const int *red;
    const int *in_type, *in_esize, *in_branch;
    const int64_t *const *in_views; /* per input: {count, op, nargs, args..., op, ...} */
    const int *out_type, *out_esize, *out_row, *out_keep, *out_rank;
    const int64_t *const *out_views;
    int nsrc;
    const int64_t *const *src; /* {rank, dims...} */
    const int *inner; /* inner stride classes (inputs, outputs) or NULL */
} GafDesc;

typedef struct { OrtCustomOp op; const GafDesc *d; } GafOp;

static const OrtApi *gaf_api;

typedef struct { int r; int64_t s[GAF_MAXD]; int64_t st[GAF_MAXD]; int64_t off; } GafView;

static OrtStatus *gaf_err(const GafDesc *d, const char *msg) {
    char buf[512];
    snprintf(buf, sizeof buf, "graph-autofusion custom operator %s: %s", d->name, msg);
    return gaf_api->CreateStatus(ORT_INVALID_ARGUMENT, buf);
}

static void gaf_contig(int r, const int64_t *s, int64_t *st) {
    int64_t acc = 1;
    for (int i = r - 1; i >= 0; i--) { st[i] = acc; acc *= (s[i] > 1 ? s[i] : 1); }
}

static int64_t gaf_prod(int r, const int64_t *s) { int64_t p = 1; for (int i = 0; i < r; i++) p *= s[i]; return p; }

/* a C-contiguous layout, size-1 axes ignored */
static int gaf_is_contig(const GafView *v) {
    int64_t acc = 1;
    for (int i = v->r - 1; i >= 0; i--) {
        if (v->s[i] == 1) continue;
        if (v->st[i] != acc) return 0;
        acc *= v->s[i];
    }
    return 1;
}

/* target dims (0: copy, -1: infer) of a reshape of shape s (rank r) */
static const char *gaf_reshape_dims(int r, const int64_t *s, int n, const int64_t *a, int64_t *out) {
    int64_t total = gaf_prod(r, s), known = 1; int infer = -1;
    if (n > GAF_MAXD) return "reshape rank too high";
    for (int i = 0; i < n; i++) {
        int64_t d = a[i];
        if (d == 0) { if (i >= r) return "reshape copies a dim the input lacks"; d = s[i]; }
        if (d == -1) { if (infer >= 0) return "two -1 in a reshape"; infer = i; out[i] = 1; continue; }
        out[i] = d; known *= d;
    }
    if (infer >= 0) { if (known == 0 || total % known) return "reshape sizes do not divide"; out[infer] = total / known; }
    else if (known != total) return "reshape changes the element count";
    return 0;
}

static const char *gaf_apply_views(GafView *v, const int64_t *p) {
    int64_t count = p ? *p++ : 0;
    for (int64_t c = 0; c < count; c++) {
        int64_t op = *p++, n = *p++; const int64_t *a = p; p += n;
        int64_t s[GAF_MAXD], st[GAF_MAXD];
        if (op == 1) { /* transpose */
            if (n != v->r) return "transpose of an input of another rank";
            for (int i = 0; i < n; i++) { if (a[i] < 0 || a[i] >= v->r) return "bad perm"; s[i] = v->s[a[i]]; st[i] = v->st[a[i]]; }
            memcpy(v->s, s, sizeof s); memcpy(v->st, st, sizeof st);
        } else if (op == 2 || op == 3) { /* reshape, flatten */
            int64_t dims[GAF_MAXD]; int nr;
            if (!gaf_is_contig(v)) return "a reshape of a strided view of an input";
            if (op == 2) {
                const char *e = gaf_reshape_dims(v->r, v->s, (int)n, a, dims);
                if (e) return e;
                nr = (int)n;
            } else {
                if (a[0] > v->r) return "flatten axis beyond the input's rank";
                dims[0] = gaf_prod((int)a[0], v->s); dims[1] = gaf_prod(v->r - (int)a[0], v->s + a[0]); nr = 2;
            }
            v->r = nr; memcpy(v->s, dims, sizeof(int64_t) * nr); gaf_contig(nr, v->s, v->st);
        } else if (op == 4) { /* unsqueeze: sorted axes */
            for (int i = 0; i < n; i++) {
                int ax = (int)a[i];
                if (v->r + 1 > GAF_MAXD || ax < 0 || ax > v->r) return "bad unsqueeze axis";
                for (int j = v->r; j > ax; j--) { v->s[j] = v->s[j - 1]; v->st[j] = v->st[j - 1]; }
                v->s[ax] = 1; v->st[ax] = 0; v->r++;
            }
        } else if (op == 5) { /* squeeze */
            int k = 0;
            for (int i = 0; i < v->r; i++) {
                int drop = 0;
                for (int j = 0; j < n; j++) if (a[j] == i) drop = 1;
                if (drop && v->s[i] != 1) return "squeeze of an axis that is not 1";
                if (!drop) { s[k] = v->s[i]; st[k] = v->st[i]; k++; }
            }
            v->r = k; memcpy(v->s, s, sizeof s); memcpy(v->st, st, sizeof st);
        } else if (op == 6) { /* slice: (axis, start, end, step) with step > 0 */
            for (int64_t i = 0; i + 3 < n; i += 4) {
                int ax = (int)a[i]; int64_t d, b, e, t = a[i + 3];
                if (ax < 0 || ax >= v->r) return "slice axis beyond the input's rank";
                d = v->s[ax]; b = a[i + 1]; e = a[i + 2];
                if (b < 0) b += d;
                if (e < 0) e += d;
                b = b < 0 ? 0 : b > d ? d : b; e = e < 0 ? 0 : e > d ? d : e;
                v->s[ax] = e > b ? (e - b + t - 1) / t : 0;
                v->off += b * v->st[ax]; v->st[ax] *= t;
            }
        } else if (op == 7) { /* select */
            int ax = (int)a[0]; int64_t i = a[1];
            if (ax < 0 || ax >= v->r) return "gather axis beyond the input's rank";
            if (i < 0) i += v->s[ax];
            if (i < 0 || i >= v->s[ax]) return "gather index out of range";
            v->off += i * v->st[ax];
            for (int j = ax; j + 1 < v->r; j++) { v->s[j] = v->s[j + 1]; v->st[j] = v->st[j + 1]; }
            v->r--;
        } else return "unknown view";
    }
    return 0;
}

typedef struct {
    const GafDesc *d; gaf_fn fn; int axis; int64_t n, chunks; int nsz;
    int64_t sz[GAF_MAXD + GAF_MAXP]; int64_t st[GAF_MAXP * GAF_MAXD]; char *ptr[GAF_MAXP]; int esize[GAF_MAXP];
} GafJob;

static void gaf_chunk(void *data, size_t i) {
    GafJob *j = (GafJob *)data;
    int D = j->d->rank, nops = j->d->nin + j->d->nout;
    int64_t lo = j->n * (int64_t)i / j->chunks, hi = j->n * ((int64_t)i + 1) / j->chunks;
    int64_t sz[GAF_MAXD + GAF_MAXP]; void *ptr[GAF_MAXP];
    memcpy(sz, j->sz, sizeof(int64_t) * j->nsz);
    sz[j->axis] = hi - lo;
    for (int p = 0; p < nops; p++) ptr[p] = j->ptr[p] + lo * j->st[p * D + j->axis] * j->esize[p];
    if (hi > lo) j->fn(sz, ptr, j->st, 1);
}

static OrtStatus *gaf_compute(const GafDesc *d, OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    const int D = d->rank, nin = d->nin, nout = d->nout, nops = nin + nout;
    GafView in[GAF_MAXP]; const OrtValue *vals[GAF_MAXP];
    int64_t loop[GAF_MAXD]; char msg[256];
    size_t count = 0;
    if ((err = api->KernelContext_GetInputCount(ctx, &count))) return err;
    if ((int)count != nin) return gaf_err(d, "wrong number of inputs");
    for (int i = 0; i < nin; i++) {
        OrtTensorTypeAndShapeInfo *info; size_t r;
        if ((err = api->KernelContext_GetInput(ctx, i, &vals[i]))) return err;
        if ((err = api->GetTensorTypeAndShape(vals[i], &info))) return err;
        err = api->GetDimensionsCount(info, &r);
        if (!err && r > GAF_MAXD) { api->ReleaseTensorTypeAndShapeInfo(info); return gaf_err(d, "input rank too high"); }
        if (!err) err = api->GetDimensions(info, in[i].s, r);
        api->ReleaseTensorTypeAndShapeInfo(info);
        if (err) return err;
        in[i].r = (int)r; in[i].off = 0; gaf_contig(in[i].r, in[i].s, in[i].st);
        const char *e = gaf_apply_views(&in[i], d->in_views[i]);
        if (e) { snprintf(msg, sizeof msg, "input %d: %s", i, e); return gaf_err(d, msg); }
        if (in[i].r > D) { snprintf(msg, sizeof msg, "input %d has rank %d, the kernel %d", i, in[i].r, D); return gaf_err(d, msg); }
    }
    /* the loop shape: inputs (a Concat branch's input with its last axis as 1), Expand shapes */
    for (int a = 0; a < D; a++) loop[a] = 1;
    for (int i = 0; i < nin + d->nsrc; i++) {
        int r; const int64_t *s; int64_t last = 0;
        if (i < nin) { r = in[i].r; s = in[i].s; if (d->in_branch[i] >= 0 && r) last = 1; }
        else { r = (int)d->src[i - nin][0]; s = d->src[i - nin] + 1; }
        for (int k = 0; k < r; k++) {
            int a = D - r + k; int64_t x = (last && k == r - 1) ? 1 : s[k];
            if (x == loop[a] || x == 1) continue;
            if (loop[a] == 1) { loop[a] = x; continue; }
            snprintf(msg, sizeof msg, "input shapes do not broadcast (axis %d: %lld vs %lld)", a, (long long)loop[a], (long long)x);
            return gaf_err(d, msg);
        }
    }
    int64_t cof[GAF_MAXP + 1]; int nb = d->nbranch;
    if (nb) {
        int64_t total = 0; cof[0] = 0;
        for (int b = 0; b < nb; b++) {
            int64_t len = 1;
            for (int i = 0; i < nin; i++) {
                if (d->in_branch[i] != b) continue;
                int64_t x = in[i].r ? in[i].s[in[i].r - 1] : 1;
                if (x == 1 || x == len) continue;
                if (len != 1) return gaf_err(d, "Concat branch inputs of different lengths");
                len = x;
            }
            total += len; cof[b + 1] = total;
        }
        if (loop[D - 1] == 1) loop[D - 1] = total;
        else if (loop[D - 1] != total) return gaf_err(d, "Concat length differs from the loop's");
        if (loop[D - 1] == 1) return gaf_err(d, "a Concat of length 1 is not supported");
    }
    /* outputs: shapes, contiguous strides over the loop */
    int isred[GAF_MAXD] = {0};
    for (int k = 0; k < d->nred; k++) isred[d->red[k]] = 1;
    int64_t os[GAF_MAXP][GAF_MAXD], ost[GAF_MAXP][GAF_MAXD], full[GAF_MAXP][GAF_MAXD]; int orank[GAF_MAXP];
    void *optr[GAF_MAXP];
    for (int o = 0; o < nout; o++) {
        int64_t s[GAF_MAXD], fs[GAF_MAXD], st[GAF_MAXD]; int n = 0, kept[GAF_MAXD], nk = 0;
        for (int a = 0; a < D; a++) {
            if (d->out_row[o] && !d->out_keep[o]) { if (!isred[a]) { kept[nk++] = a; s[n++] = loop[a]; } }
            else s[n++] = (d->out_row[o] && isred[a]) ? 1 : loop[a];
        }
        int R = d->out_rank[o];
        if (R > GAF_MAXD) return gaf_err(d, "output rank too high");
        if (R <= n) { memmove(s, s + (n - R), sizeof(int64_t) * R); if (nk) memmove(kept, kept + (n - R), sizeof(int) * R); }
        else { memmove(s + (R - n), s, sizeof(int64_t) * n); for (int a = 0; a < R - n; a++) s[a] = 1; }
        memcpy(os[o], s, sizeof(int64_t) * R); orank[o] = R;
        gaf_contig(R, s, st);
        if (d->out_row[o] && !d->out_keep[o]) {
            for (int a = 0; a < D; a++) { fs[a] = 1; full[o][a] = 0; }
            if (R > nk) return gaf_err(d, "output rank wider than its kept axes");
            for (int k = 0; k < R; k++) { fs[kept[k]] = s[k]; full[o][kept[k]] = s[k] != 1 ? st[k] : 0; }
        } else {
            if (R > D) return gaf_err(d, "output rank wider than the loop");
            for (int a = 0; a < D; a++) full[o][a] = 0;
            for (int k = 0; k < R; k++) full[o][D - R + k] = s[k] != 1 ? st[k] : 0;
        }
        (void)fs;
        /* the graph's shape: the output's reshapes on the contiguous result */
        GafView ov; ov.r = R; ov.off = 0; memcpy(ov.s, s, sizeof(int64_t) * R); gaf_contig(R, ov.s, ov.st);
        const char *e = gaf_apply_views(&ov, d->out_views[o]);
        if (e) { snprintf(msg, sizeof msg, "output %d: %s", o, e); return gaf_err(d, msg); }
        OrtValue *out;
        if ((err = api->KernelContext_GetOutput(ctx, o, ov.s, ov.r, &out))) return err;
        if ((err = api->GetTensorMutableData(out, &optr[o]))) return err;
    }
    /* sizes and strides in kernel order (outer axes, then the reduced ones), merged */
    int order[GAF_MAXD], grp[GAF_MAXD], no_ = 0;
    for (int a = 0; a < D; a++) if (!isred[a]) { order[no_] = a; grp[no_] = 0; no_++; }
    for (int a = 0, k = no_; a < D; a++) if (isred[a]) { order[k] = a; grp[k] = 1; k++; }
    if (!d->nred) { for (int a = 0; a < D; a++) grp[a] = 0; if (nb) grp[D - 1] = 2; }
    int64_t ps[GAF_MAXP][GAF_MAXD];
    for (int p = 0; p < nops; p++) {
        int64_t ls[GAF_MAXD];
        for (int a = 0; a < D; a++) ls[a] = 0;
        if (p < nin) { int r = in[p].r; for (int k = 0; k < r; k++) ls[D - r + k] = in[p].s[k] != 1 ? in[p].st[k] : 0; }
        else memcpy(ls, full[p - nin], sizeof ls);
        for (int k = 0; k < D; k++) ps[p][k] = ls[order[k]];
    }
    int64_t csz[GAF_MAXD], cst[GAF_MAXP][GAF_MAXD]; int cg[GAF_MAXD], n = 0;
    for (int k = 0; k < D; k++) {
        int64_t sk = loop[order[k]];
        if (sk == 1) continue;
        int merge = n > 0 && cg[n - 1] == grp[k];
        for (int p = 0; merge && p < nops; p++) if (ps[p][k] * sk != cst[p][n - 1]) merge = 0;
        if (merge) { csz[n - 1] *= sk; for (int p = 0; p < nops; p++) cst[p][n - 1] = ps[p][k]; continue; }
        csz[n] = sk; cg[n] = grp[k]; for (int p = 0; p < nops; p++) cst[p][n] = ps[p][k]; n++;
    }
    int outer[GAF_MAXD], inner[GAF_MAXD], nout_ax = 0, nin_ax = 0;
    if (d->nred) { for (int k = 0; k < n; k++) { if (cg[k] == 0) outer[nout_ax++] = k; else inner[nin_ax++] = k; } }
    else { for (int k = 0; k < n; k++) { if (k < n - 1) outer[nout_ax++] = k; else inner[nin_ax++] = k; } }
    int ni = d->nred ? d->nred : 1, no = D - ni;
    if (nout_ax > no || nin_ax > ni) return gaf_err(d, "merged axes exceed the kernel's");
    static __thread GafJob job_tls; GafJob *job = &job_tls;
    int64_t *sz = job->sz; int64_t *st = job->st; int pad_o = no - nout_ax, pad_i = ni - nin_ax;
    for (int k = 0; k < D; k++) {
        int src = k < pad_o ? -1 : k < no ? outer[k - pad_o] : k < no + pad_i ? -1 : inner[k - no - pad_i];
        sz[k] = src < 0 ? 1 : csz[src];
        for (int p = 0; p < nops; p++) st[p * D + k] = src < 0 ? 0 : cst[p][src];
    }
    int nsz = D;
    if (nb) for (int b = 0; b <= nb; b++) sz[nsz++] = cof[b];
    int fast = d->fast != 0 && d->inner != 0;
    for (int p = 0; fast && p < nops; p++) if (st[p * D + D - 1] != d->inner[p] && sz[D - 1] != 1) fast = 0;
    job->d = d; job->fn = fast ? d->fast : d->generic; job->nsz = nsz;
    for (int p = 0; p < nops; p++) {
        job->esize[p] = p < nin ? d->in_esize[p] : d->out_esize[p - nin];
        if (p < nin) {
            void *data;
            if ((err = api->GetTensorMutableData((OrtValue *)vals[p], &data))) return err;
            job->ptr[p] = (char *)data + in[p].off * job->esize[p];
        } else job->ptr[p] = (char *)optr[p - nin];
    }
    int64_t total = gaf_prod(D, sz);
    if (total == 0 && !d->nred) return 0;
    /* split one axis over onnxruntime's threads: the widest outer one (an elementwise kernel
       without a Concat may split its inner axis) */
    int axis = -1; int64_t best = 1;
    for (int k = 0; k < no; k++) if (sz[k] > best) { best = sz[k]; axis = k; }
    if (axis < 0 && !d->nred && !nb && sz[D - 1] > 1) { axis = D - 1; best = sz[D - 1]; }
    int64_t chunks = total / GAF_PARALLEL_MIN;
    if (chunks > best) chunks = best;
    if (chunks > 64) chunks = 64;
    if (axis < 0 || chunks < 2) { job->fn(sz, (void *const *)job->ptr, st, 1); return 0; }
    job->axis = axis; job->n = sz[axis]; job->chunks = chunks;
    return api->KernelContext_ParallelFor(ctx, gaf_chunk, (size_t)chunks, 0, job);
}

static const char *ORT_API_CALL gaf_name(const OrtCustomOp *op) { return ((const GafOp *)op)->d->name; }
static const char *ORT_API_CALL gaf_ep(const OrtCustomOp *op) { (void)op; return 0; }
static ONNXTensorElementDataType ORT_API_CALL gaf_in_type(const OrtCustomOp *op, size_t i) { return (ONNXTensorElementDataType)((const GafOp *)op)->d->in_type[i]; }
static size_t ORT_API_CALL gaf_in_count(const OrtCustomOp *op) { return (size_t)((const GafOp *)op)->d->nin; }
static ONNXTensorElementDataType ORT_API_CALL gaf_out_type(const OrtCustomOp *op, size_t i) { return (ONNXTensorElementDataType)((const GafOp *)op)->d->out_type[i]; }
static size_t ORT_API_CALL gaf_out_count(const OrtCustomOp *op) { return (size_t)((const GafOp *)op)->d->nout; }
static void *ORT_API_CALL gaf_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) { (void)api; (void)info; return (void *)((const GafOp *)op)->d; }
static OrtStatusPtr ORT_API_CALL gaf_create2(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **k) { (void)api; (void)info; *k = (void *)((const GafOp *)op)->d; return 0; }
static void ORT_API_CALL gaf_compute1(void *k, OrtKernelContext *ctx) { OrtStatus *s = gaf_compute((const GafDesc *)k, ctx); if (s) gaf_api->ReleaseStatus(s); }
static OrtStatusPtr ORT_API_CALL gaf_compute2(void *k, OrtKernelContext *ctx) { return gaf_compute((const GafDesc *)k, ctx); }
static void ORT_API_CALL gaf_destroy(void *k) { (void)k; }
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL gaf_required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return INPUT_OUTPUT_REQUIRED; }
static OrtMemType ORT_API_CALL gaf_memtype(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }
static int ORT_API_CALL gaf_one(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL gaf_start(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL gaf_end(const OrtCustomOp *op) { (void)op; return INT_MAX; }

static void gaf_fill(GafOp *g, const GafDesc *d) {
    memset(g, 0, sizeof *g);
    g->d = d;
    g->op.version = ORT_API_VERSION;
    g->op.CreateKernel = gaf_create;
    g->op.GetName = gaf_name;
    g->op.GetExecutionProviderType = gaf_ep;
    g->op.GetInputType = gaf_in_type;
    g->op.GetInputTypeCount = gaf_in_count;
    g->op.GetOutputType = gaf_out_type;
    g->op.GetOutputTypeCount = gaf_out_count;
    g->op.KernelCompute = gaf_compute1;
    g->op.KernelDestroy = gaf_destroy;
    g->op.GetInputCharacteristic = gaf_required;
    g->op.GetOutputCharacteristic = gaf_required;
    g->op.GetInputMemoryType = gaf_memtype;
    g->op.GetVariadicInputMinArity = gaf_one;
    g->op.GetVariadicInputHomogeneity = gaf_one;
    g->op.GetVariadicOutputMinArity = gaf_one;
    g->op.GetVariadicOutputHomogeneity = gaf_one;
    g->op.CreateKernelV2 = gaf_create2;
    g->op.KernelComputeV2 = gaf_compute2;
    g->op.GetStartVersion = gaf_start;
    g->op.GetEndVersion = gaf_end;
}
"""
