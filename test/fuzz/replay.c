/* SPDX-License-Identifier: MIT */
/*
 * replay.c - run a libFuzzer target over its corpus without libFuzzer, so
 * that `make check` exercises the fuzz targets with gcc (jansson's
 * standaloneengine.cc).
 *
 *   replay DIR_OR_FILE...
 *
 * Every regular file in each directory (names starting with '.' skipped,
 * in name order), and every file named directly, is read into a heap
 * block of its exact size and passed to LLVMFuzzerTestOneInput() once;
 * AddressSanitizer then catches a read past the end of an input.  The
 * target reports problems by crashing or aborting.  Exits 1 on an I/O
 * error or when no input was found at all; else says how many inputs
 * passed, under the program's own name (one replay binary per target).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Feed one file to the target.  Returns 0, or -1 (reported here). */
static int
run_file(const char *path)
{
    struct stat st;
    uint8_t *data = NULL;
    FILE *f = NULL;
    size_t size;
    int rc = -1;

    f = fopen(path, "rb");
    if (f == NULL || fstat(fileno(f), &st) == -1) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        goto out;
    }
    size = (size_t)st.st_size;
    data = malloc(size > 0 ? size : 1);
    if (data == NULL) {
        fprintf(stderr, "replay: %s: out of memory\n", path);
        goto out;
    }
    if (fread(data, 1, size, f) != size) {
        fprintf(stderr, "replay: %s: short read\n", path);
        goto out;
    }
    LLVMFuzzerTestOneInput(data, size);
    rc = 0;

out:
    free(data);
    if (f != NULL)
        fclose(f);
    return rc;
}

static int
skip_hidden(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

/* Feed every regular file in 'dir'; OUT *count is increased. */
static int
run_dir(const char *dir, int *count)
{
    struct dirent **names = NULL;
    struct stat st;
    char path[4096];
    int n, i, rc = 0;

    n = scandir(dir, &names, skip_hidden, alphasort);
    if (n == -1) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    for (i = 0; i < n; i++) {
        if (rc == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                rc = run_file(path);
                if (rc == 0)
                    (*count)++;
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int
main(int argc, char **argv)
{
    struct stat st;
    int count = 0, i;

    for (i = 1; i < argc; i++) {
        if (stat(argv[i], &st) == -1) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            if (run_dir(argv[i], &count) != 0)
                return 1;
        } else {
            if (run_file(argv[i]) != 0)
                return 1;
            count++;
        }
    }
    if (count == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    printf("%s: %d inputs ok\n", argv[0], count);
    return 0;
}
