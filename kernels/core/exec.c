/* exec.c: the one executor of a kernel family: compile, load, size the
 * scratch, fill the kernel context, launch (see exec.h). */
#include "exec.h"

#include <inttypes.h>
#include <stdlib.h>

struct kern_scratch {
    dev_device *dev;
    void *ptr;
    size_t bytes;
};

struct kern_exec {
    dev_device *dev;
    const dev_props *props;
    const kern_family *fam;
    const kern_impl *impl;
    kern_shape shape;
    kern_config cfg;
    dev_code *code;
    dev_module *mod;
    kern_scratch own;
    kern_scratch *sc; /* &own, or a shared one */
};

mt_status kern_compile(dev_device *d, const kern_family *f, const kern_impl *im,
                       const kern_shape *s, const kern_config *cfg, dev_code **code,
                       mt_err *err)
{
    kern_defines defs;
    dev_compile_req req;
    mt_status st = kern_compile_req(f, im, s, cfg, dev_get_props(d), &defs, &req, err);
    if (st != MT_OK)
        return st;
    return dev_compile(d, &req, code, err);
}

static const kern_impl *impl_for(dev_device *d, const kern_family *f, mt_err *err)
{
    const dev_props *p = dev_get_props(d);
    const kern_impl *im = kern_family_impl(f, p->backend);
    if (!im)
        mt_fail(err, MT_E_UNSUPPORTED, "family %s has no implementation for %s", f->name,
                p->spec);
    return im;
}

mt_status kern_exec_open_code(dev_device *d, const kern_family *f, const kern_shape *s,
                              const kern_config *cfg, dev_code *code, kern_exec **out,
                              mt_err *err)
{
    *out = NULL;
    const kern_impl *im = impl_for(d, f, err);
    kern_exec *e = im ? calloc(1, sizeof *e) : NULL;
    if (!e) {
        dev_code_free(code);
        return im ? mt_fail(err, MT_E_NOMEM, "exec of %s", f->name) : MT_E_UNSUPPORTED;
    }
    *e = (kern_exec){.dev = d, .props = dev_get_props(d), .fam = f, .impl = im, .shape = *s,
                     .cfg = *cfg, .code = code, .own = {.dev = d}};
    e->sc = &e->own;
    mt_status st = dev_module_load(d, code, &e->mod, err);
    if (st != MT_OK) {
        char ck[256];
        kern_config_key(im, cfg, ck, sizeof ck);
        mt_err_prefix(err, "loading %s config %s", f->name, ck);
        kern_exec_close(e);
        return st;
    }
    *out = e;
    return MT_OK;
}

mt_status kern_exec_open(dev_device *d, const kern_family *f, const kern_shape *s, int64_t m,
                         const kern_config *cfg, kern_exec **out, mt_err *err)
{
    *out = NULL;
    const kern_impl *im = impl_for(d, f, err);
    if (!im)
        return MT_E_UNSUPPORTED;
    const dev_props *p = dev_get_props(d);
    kern_config c;
    if (cfg)
        c = *cfg;
    else
        im->default_config(s, m, p, &c);
    char why[256] = "";
    if (!kern_config_valid(f, im, s, m, &c, p, why, sizeof why)) {
        char ck[256], key[KERN_KEY_MAX];
        kern_config_key(im, &c, ck, sizeof ck);
        kern_shape_key(f, s, false, key, sizeof key);
        return mt_fail(err, MT_E_INVALID, "%s (%s, M=%" PRId64 "): config %s is not valid: %s",
                       f->name, key, m, ck, why);
    }
    dev_code *code = NULL;
    mt_status st = kern_compile(d, f, im, s, &c, &code, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "compiling %s", f->name);
    return kern_exec_open_code(d, f, s, &c, code, out, err);
}

void kern_exec_close(kern_exec *e)
{
    if (!e)
        return;
    dev_free(e->dev, e->own.ptr);
    dev_module_unload(e->mod);
    dev_code_free(e->code);
    free(e);
}

static mt_status scratch_grow(kern_scratch *sc, size_t need, mt_err *err)
{
    if (need <= sc->bytes)
        return MT_OK;
    /* A launch in flight may still read the old buffer. */
    mt_status st = sc->ptr ? dev_synchronize(sc->dev, err) : MT_OK;
    if (st != MT_OK)
        return st;
    dev_free(sc->dev, sc->ptr);
    sc->ptr = NULL;
    sc->bytes = 0;
    st = dev_alloc(sc->dev, need, &sc->ptr, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "scratch of %zu bytes", need);
    sc->bytes = need;
    return MT_OK;
}

static bool same_tuning_dims(const kern_family *f, const kern_shape *a, const kern_shape *b)
{
    for (int i = 0; i < f->n_dims; i++)
        if (!f->dims[i].runtime && a->v[i] != b->v[i])
            return false;
    return true;
}

mt_status kern_exec_run(kern_exec *e, const kern_shape *s, int64_t m, void *const *bufs,
                        mt_err *err)
{
    if (m <= 0)
        return MT_OK;
    if (!s)
        s = &e->shape;
    else if (!same_tuning_dims(e->fam, s, &e->shape)) {
        char want[KERN_KEY_MAX], got[KERN_KEY_MAX];
        kern_shape_key(e->fam, &e->shape, false, want, sizeof want);
        kern_shape_key(e->fam, s, false, got, sizeof got);
        return mt_fail(err, MT_E_INVALID, "%s: compiled for %s, called with %s", e->fam->name,
                       want, got);
    }
    size_t need = e->impl->scratch_bytes ? e->impl->scratch_bytes(s, m, &e->cfg) : 0;
    mt_status st = scratch_grow(e->sc, need, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "%s M=%" PRId64, e->fam->name, m);
    kern_ctx c = {.dev = e->dev, .mod = e->mod, .props = e->props, .fam = e->fam,
                  .impl = e->impl, .shape = s, .m = m, .cfg = &e->cfg, .bufs = bufs,
                  .scratch = e->sc->ptr};
    st = e->impl->run(&c, err);
    if (st != MT_OK)
        mt_err_prefix(err, "%s M=%" PRId64, e->fam->name, m);
    return st;
}

void kern_exec_share_scratch(kern_exec *e, kern_scratch *sc) { e->sc = sc ? sc : &e->own; }

dev_device *kern_exec_device(const kern_exec *e) { return e->dev; }
const kern_family *kern_exec_family(const kern_exec *e) { return e->fam; }
const kern_impl *kern_exec_impl(const kern_exec *e) { return e->impl; }
const kern_config *kern_exec_config(const kern_exec *e) { return &e->cfg; }
const kern_shape *kern_exec_shape(const kern_exec *e) { return &e->shape; }
const dev_code *kern_exec_code(const kern_exec *e) { return e->code; }

mt_status kern_scratch_create(dev_device *d, kern_scratch **out, mt_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return mt_fail(err, MT_E_NOMEM, "scratch");
    (*out)->dev = d;
    return MT_OK;
}

void kern_scratch_destroy(kern_scratch *sc)
{
    if (!sc)
        return;
    dev_free(sc->dev, sc->ptr);
    free(sc);
}

size_t kern_scratch_bytes(const kern_scratch *sc) { return sc->bytes; }
