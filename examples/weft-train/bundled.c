/* examples/weft-train/bundled.c: the bundled-data lookup of bundled.h.
 * Owns: resolving the program's own path (readlink of /proc/self/exe) and the installed
 * file's path relative to it. Not here: what the file holds or how it is read. */
#include "bundled.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* <dir of the running program>/../<datadir>/weft/<name> into out; 0, or -1 when the program's
 * path is unknown or too long. */
static int installed_path(const char *datadir, const char *name, char *out, size_t outlen)
{
    if (datadir[0] == '/') {
        int n = snprintf(out, outlen, "%s/weft/%s", datadir, name);
        return n < 0 || (size_t)n >= outlen ? -1 : 0;
    }
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return -1;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return -1;
    *slash = '\0'; /* the program's folder, e.g. PREFIX/bin */
    int n = snprintf(out, outlen, "%s/../%s/weft/%s", exe, datadir, name);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

static int readable(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fclose(f);
    return 1;
}

static void note(char *tried, size_t triedlen, const char *path)
{
    if (!tried || !triedlen)
        return;
    size_t used = strlen(tried);
    if (used + 1 >= triedlen)
        return;
    snprintf(tried + used, triedlen - used, "%s%s", used ? ", " : "", path);
}

int wt_bundled_find(const char *override, const char *datadir, const char *name, const char *source,
                    char *out, size_t outlen, char *tried, size_t triedlen)
{
    if (tried && triedlen)
        tried[0] = '\0';
    char installed[4096];
    int have_installed = installed_path(datadir, name, installed, sizeof installed) == 0;
    const char *paths[] = { override, have_installed ? installed : NULL, source };
    for (int i = 0; i < 3; i++) {
        if (!paths[i])
            continue;
        note(tried, triedlen, paths[i]);
        if (readable(paths[i])) {
            snprintf(out, outlen, "%s", paths[i]);
            return 0;
        }
    }
    snprintf(out, outlen, "%s", source);
    return -1;
}
