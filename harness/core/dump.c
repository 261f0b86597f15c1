/* dump.c: `kvbench check --dump DIR` (cli.h): each case's arrays as .npy files with a meta.json that
 * says what each file holds. Only computed data is written: a sampled reference's skipped slices are
 * NaN (floating dtypes) or -1 (integers) with a mask file beside them, an output without a reference
 * (KVB_T_NO_REF) has no .ref.npy, and a case whose setup failed part way gets meta.json alone. A file
 * that cannot be written is an error naming its path. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/core/cli.h"

#ifndef KVB_GIT_REV
#define KVB_GIT_REV "unknown"
#endif

/* mkdir -p: every missing directory of path; an existing non-directory fails */
static int make_dirs(const char *path)
{
    char p[1024];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return kvb_fail(KVB_EIO, "cannot create %s: path longer than %zu characters", path, sizeof p - 1);
    for (char *s = p + 1;; s++) {
        const int last = *s == '\0';
        if (*s != '/' && !last) continue;
        *s = '\0';
        struct stat st;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return kvb_fail(KVB_EIO, "cannot create %s: %s", p, strerror(errno));
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
            return last ? kvb_fail(KVB_EIO, "cannot create %s: it exists and is not a directory", path)
                        : kvb_fail(KVB_EIO, "cannot create %s: %s exists and is not a directory", path, p);
        if (last) return KVB_OK;
        *s = '/';
    }
}

int kvb_dump_prepare(const char *dir)
{
    if (!dir || !*dir) return kvb_fail(KVB_EIO, "--dump needs a directory");
    if (make_dirs(dir) != KVB_OK) return KVB_EIO;
    /* writable: a file created and removed (access() would say yes to root on a read-only mount) */
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/.kvbench_dump_probe_XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) return kvb_fail(KVB_EIO, "cannot write in %s: %s", dir, strerror(errno));
    close(fd);
    unlink(probe);
    return KVB_OK;
}

typedef struct dump_ctx {
    char dir[1024];
    kvb_run *r;
} dump_ctx;

static void file_path(const dump_ctx *d, const char *name, const char *suffix, char *out, size_t n)
{
    snprintf(out, n, "%s/%s%s", d->dir, name, suffix);
}

/* A file of a previous dump that this one does not write would be read as this case's data: removed. */
static int remove_stale(const dump_ctx *d, const char *name, const char *suffix)
{
    char path[1200];
    file_path(d, name, suffix, path, sizeof path);
    struct stat st;
    if (lstat(path, &st) != 0) return KVB_OK;
    if (!S_ISREG(st.st_mode) || unlink(path) != 0)
        return kvb_fail(KVB_EIO, "cannot remove %s, left by an earlier dump: %s", path,
                        S_ISREG(st.st_mode) ? strerror(errno) : "not a regular file");
    return KVB_OK;
}

static const char *role_name(int role)
{
    return role == KVB_IN ? "in" : role == KVB_OUT ? "out" : role == KVB_INOUT ? "inout" : "scratch";
}

static const char *npy_descr(kvb_dtype t)
{
    static const char *descr[] = {"<u2", "<f2", "<f4", "<f8", "<i4", "<u4", "|u1"};
    return descr[t];
}

/* What is known about t's reference, for the files and meta.json */
typedef enum { REF_NONE_ROLE, REF_COMPUTED, REF_SAMPLED, REF_NO_REF, REF_NOT_COMPUTED, REF_LOST } ref_state;

static ref_state ref_state_of(const kvb_run *r, const kvb_tensor *t)
{
    if (t->role != KVB_OUT && t->role != KVB_INOUT) return REF_NONE_ROLE;
    if (t->flags & KVB_T_NO_REF) return REF_NO_REF;
    if (!r->ref_ready || !t->ref) return REF_NOT_COMPUTED;
    if (r->ref_from_device < 0) return REF_LOST;
    return t->slice_mask ? REF_SAMPLED : REF_COMPUTED;
}

/* Writes t's files (the ones this case has) and removes the others' stale copies. */
static int dump_tensor(const dump_ctx *d, const kvb_tensor *t)
{
    const kvb_run *r = d->r;
    char path[1200];
    const int dumped = !(t->flags & KVB_T_NO_DUMP);
    const int has_in = dumped && r->ref_ready && t->h && (t->role == KVB_IN || t->role == KVB_INOUT);
    const ref_state rs = ref_state_of(r, t);
    const int has_ref = dumped && (rs == REF_COMPUTED || rs == REF_SAMPLED);
    const int has_out = dumped && r->out_ready && t->out && (t->role == KVB_OUT || t->role == KVB_INOUT);
    int rc = KVB_OK;
    if (has_in) file_path(d, t->name, ".npy", path, sizeof path), rc = kvb_npy_write(path, t->dtype, t->ndim, t->shape, t->h);
    else rc = remove_stale(d, t->name, ".npy");
    if (rc) return rc;
    if (has_ref) {
        file_path(d, t->name, ".ref.npy", path, sizeof path);
        rc = kvb_npy_write_sampled(path, t->dtype, t->ndim, t->shape, t->ref, t->slice_len, t->slice_mask);
    } else {
        rc = remove_stale(d, t->name, ".ref.npy");
    }
    if (rc) return rc;
    if (has_ref && rs == REF_SAMPLED) {
        file_path(d, t->name, ".ref_mask.npy", path, sizeof path);
        rc = kvb_npy_write_mask(path, t->ndim, t->shape, t->slice_len, t->slice_mask);
    } else {
        rc = remove_stale(d, t->name, ".ref_mask.npy");
    }
    if (rc) return rc;
    if (has_out) file_path(d, t->name, ".out.npy", path, sizeof path), rc = kvb_npy_write(path, t->dtype, t->ndim, t->shape, t->out);
    else rc = remove_stale(d, t->name, ".out.npy");
    return rc;
}

static void tensor_meta(kvb_json *j, const kvb_run *r, const kvb_tensor *t)
{
    static const char *const kinds[] = KVB_CMP_KIND_NAMES;
    char file[64];
    kvb_json_obj(j, NULL);
    kvb_json_str(j, "name", t->name);
    kvb_json_str(j, "role", role_name(t->role));
    kvb_json_str(j, "dtype", kvb_dtype_name(t->dtype));
    kvb_json_str(j, "npy_dtype", npy_descr(t->dtype));
    kvb_json_arr(j, "shape");
    for (int i = 0; i < t->ndim; i++) kvb_json_int(j, NULL, t->shape[i]);
    kvb_json_close(j);
    const int dumped = !(t->flags & KVB_T_NO_DUMP);
    kvb_json_bool(j, "dumped", dumped);
    if (!dumped) kvb_json_str(j, "why_not", "marked by its op as too large or not useful to dump");
    if (dumped && r->ref_ready && t->h && (t->role == KVB_IN || t->role == KVB_INOUT)) {
        snprintf(file, sizeof file, "%s.npy", t->name);
        kvb_json_str(j, t->role == KVB_INOUT ? "initial_file" : "input_file", file);
    }
    const ref_state rs = ref_state_of(r, t);
    if (rs == REF_NONE_ROLE) {
        kvb_json_close(j);
        return;
    }
    kvb_json_str(j, "compare", kinds[t->cmp]);
    if (t->cmp == KVB_CMP_NONE)
        kvb_json_str(j, "judged_by", "the op's own check of the device's outputs (out_check), not a reference");
    static const char *const ref_text[] = {
        [REF_COMPUTED] = "computed",
        [REF_SAMPLED] = "sampled",
        [REF_NO_REF] = "none: this output has no reference; it is judged by another rule",
        [REF_NOT_COMPUTED] = "not computed: the case's setup failed",
        [REF_LOST] = "not written: recomputing it from the device's outputs failed part way",
    };
    kvb_json_str(j, "reference", ref_text[rs]);
    if (dumped && (rs == REF_COMPUTED || rs == REF_SAMPLED)) {
        snprintf(file, sizeof file, "%s.ref.npy", t->name);
        kvb_json_str(j, "reference_file", file);
    }
    if (rs == REF_SAMPLED) {
        const int64_t n_slices = (t->n + t->slice_len - 1) / t->slice_len;
        int64_t computed = 0;
        for (int64_t s = 0; s < n_slices; s++) computed += t->slice_mask[s] != 0;
        kvb_json_int(j, "slices", n_slices);
        kvb_json_int(j, "slices_computed", computed);
        kvb_json_int(j, "slice_elements", t->slice_len);
        kvb_json_str(j, "skipped_slices_hold", kvb_dtype_is_float(t->dtype) ? "NaN" : "-1 (every bit set)");
        if (dumped) {
            snprintf(file, sizeof file, "%s.ref_mask.npy", t->name);
            kvb_json_str(j, "reference_mask_file", file);
        }
    }
    if (dumped && r->out_ready && t->out) {
        snprintf(file, sizeof file, "%s.out.npy", t->name);
        kvb_json_str(j, "output_file", file);
    }
    kvb_json_close(j);
}

static int write_meta(const dump_ctx *d)
{
    const kvb_run *r = d->r;
    char path[1200], repro[KVB_ID_MAX + 128];
    file_path(d, "meta", ".json", path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) return kvb_fail(KVB_EIO, "cannot write %s: %s", path, strerror(errno));
    kvb_json j;
    kvb_json_begin(&j, f);
    kvb_json_str(&j, "case", r->c->id);
    kvb_case_repro(r->c, repro, sizeof repro);
    kvb_json_str(&j, "reproduce", repro);
    kvb_json_str(&j, "git_revision", KVB_GIT_REV);
    kvb_json_str(&j, "note", r->note);
    kvb_json_bool(&j, "reference_computed", r->ref_ready);
    kvb_json_bool(&j, "device_outputs", r->out_ready);
    if (r->ref_from_device > 0)
        kvb_json_str(&j, "references_from_device",
                     "some references were recomputed from the device's own choice (a tie-tolerant selection) before "
                     "the comparison: they are written as compared");
    kvb_json_str(&j, "files",
                 "<name>.npy: an input (an in-place tensor's contents before the launch); <name>.ref.npy: the CPU "
                 "reference; <name>.out.npy: what the device wrote; <name>.ref_mask.npy (uint8, the tensor's shape): "
                 "1 where a sampled reference was computed. bf16 is stored as '<u2' bit patterns (view with "
                 "ml_dtypes.bfloat16).");
    kvb_json_arr(&j, "tensors");
    for (int i = 0; i < r->nt; i++)
        if (r->t[i].role != KVB_SCRATCH) tensor_meta(&j, r, &r->t[i]);
    kvb_json_close(&j);
    kvb_json_end(&j);
    int err = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (err) {
        remove(path);
        return kvb_fail(KVB_EIO, "cannot write %s: %s", path, strerror(err));
    }
    return KVB_OK;
}

int kvb_dump_run(const char *dir, kvb_run *r)
{
    dump_ctx d = {.r = r};
    size_t len = (size_t)snprintf(d.dir, sizeof d.dir, "%s/", dir);
    for (const char *p = r->c->id; *p && len + 1 < sizeof d.dir; p++) d.dir[len++] = *p == ' ' || *p == '/' ? '_' : *p;
    d.dir[len] = '\0';
    if (make_dirs(d.dir) != KVB_OK) return KVB_EIO;
    /* meta.json last, and an earlier one gone first: a dump cut short has none */
    if (remove_stale(&d, "meta", ".json") != KVB_OK) return KVB_EIO;
    for (int i = 0; i < r->nt; i++) {
        const kvb_tensor *t = &r->t[i];
        if (t->role != KVB_SCRATCH && dump_tensor(&d, t) != KVB_OK) return KVB_EIO;
    }
    if (write_meta(&d) != KVB_OK) return KVB_EIO;
    printf("      dumped to %s/\n", d.dir);
    return KVB_OK;
}
