/* api_device.c: moetune_device: open, databases, info, close (see
 * include/moetune/device.h). */
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"

moetune_status moetune_device_open(const char *spec, moetune_device **out)
{
    if (!out)
        return MOETUNE_E_MISUSE;
    moetune_device *dev = calloc(1, sizeof *dev);
    *out = dev;
    if (!dev)
        return MOETUNE_E_NOMEM;
    dev->refs = 1;
    if (!spec)
        return api_fail(dev, MOETUNE_E_INVALID, "device spec is NULL (\"cpu\", \"emu\", "
                        "\"hip:0\", \"cuda:0\", \"auto\")");
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open(spec, NULL, &dev->dev, &err);
    if (st != MT_OK) {
        dev->dev = NULL;
        mt_err_prefix(&err, "opening device '%s'", spec);
        return api_done(dev, st, &err);
    }
    dev->props = dev_get_props(dev->dev);
    return api_done(dev, MT_OK, NULL);
}

/* The device's resources go with its last hold (moetune_device_close and
 * every layer each hold it). */
void api_device_release(moetune_device *dev)
{
    if (!dev || --dev->refs > 0)
        return;
    for (int i = 0; i < dev->n_dbs; i++)
        db_close(dev->dbs[i]);
    dev_close(dev->dev);
    free(dev);
}

void moetune_device_close(moetune_device *dev) { api_device_release(dev); }

static moetune_status check_open(moetune_device *dev)
{
    if (!dev->dev)
        return api_fail(dev, MOETUNE_E_MISUSE, "the device did not open");
    return MOETUNE_OK;
}

moetune_status moetune_device_add_db(moetune_device *dev, const char *path)
{
    if (!dev)
        return MOETUNE_E_MISUSE;
    moetune_status ps = check_open(dev);
    if (ps != MOETUNE_OK)
        return ps;
    if (!path || !path[0])
        return api_fail(dev, MOETUNE_E_INVALID, "database path is empty");
    if (dev->n_dbs == API_MAX_DBS)
        return api_fail(dev, MOETUNE_E_INVALID, "%s: a device reads at most %d databases",
                        path, API_MAX_DBS);
    mt_err err = MT_ERR_INIT;
    db_t *db = NULL;
    mt_status st = db_open(path, DB_OPEN_READONLY, &db, &err);
    if (st != MT_OK)
        return api_done(dev, st, &err);
    dev->dbs[dev->n_dbs++] = db;
    return api_done(dev, MT_OK, NULL);
}

int moetune_device_db_count(const moetune_device *dev) { return dev ? dev->n_dbs : 0; }

moetune_status moetune_device_get_info(moetune_device *dev, moetune_device_info *out)
{
    if (!dev || !out)
        return dev ? api_fail(dev, MOETUNE_E_MISUSE, "info: out is NULL") : MOETUNE_E_MISUSE;
    moetune_status ps = check_open(dev);
    if (ps != MOETUNE_OK)
        return ps;
    const dev_props *p = dev->props;
    memset(out, 0, sizeof *out);
    out->backend = (moetune_backend)p->backend;
    snprintf(out->spec, sizeof out->spec, "%s", p->spec);
    snprintf(out->arch, sizeof out->arch, "%s", p->arch);
    snprintf(out->name, sizeof out->name, "%s", p->name);
    out->compute_units = p->compute_units;
    out->host_memory = p->backend == DEV_BACKEND_CPU || p->backend == DEV_BACKEND_EMU;
    return api_done(dev, MT_OK, NULL);
}

moetune_status moetune_device_synchronize(moetune_device *dev)
{
    if (!dev)
        return MOETUNE_E_MISUSE;
    moetune_status ps = check_open(dev);
    if (ps != MOETUNE_OK)
        return ps;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_synchronize(dev->dev, &err);
    return api_done(dev, st, &err);
}
