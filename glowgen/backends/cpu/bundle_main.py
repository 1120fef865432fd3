"""The example program a bundle ships: main.c loads the weights, reads each input from a raw
file, runs the entry point (on POSIX threads with --threads N) and writes each output."""
from __future__ import annotations

from ...lir.ir import Program

MAIN_C = r"""/* main.c: run the glowgen bundle `@NAME@` once, on inputs read from raw binary files.
 *
 * Build:  gcc -O2 -pthread main.c @NAME@.o -lm -o @NAME@
 * Usage:  ./@NAME@ [--weights FILE] [--threads N] INPUT_FILE... OUTPUT_FILE...
 *   one file per model input, in order, then one file per model output, in order:
@IO_DOC@
 *   `./@NAME@ --help` prints the same list.
 * Every file holds raw tensor data: little-endian, row-major (C order), no header; an input
 * file must hold exactly the input's size in bytes.  With numpy:
 *   x.astype("<f4").tofile("input.bin")      np.fromfile("output.bin", "<f4").reshape(shape)
 * The weights are read from @NAME@.weights.bin in the executable's directory (or the current
 * directory when the executable was found through PATH) unless --weights FILE is given.
 * --threads N runs the model on N threads (default @P@_THREADS, what it was compiled for):
 * a small pool on POSIX threads (pool_parallel_for below) that @NAME@_parallel hands its
 * split steps to.  The answer is the same bit for bit for any N.
 * Exit status: 0 on success, 1 for bad usage, 2 for a file error, 3 if the model fails.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "@NAME@.h"

/* A work pool: the caller publishes a round of n items; it and the workers take items one
 * at a time under the lock (each item is a large piece of a kernel: the lock is not hot). */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t start, done;
  glowgen_task task;
  void *env;
  int64_t n, next, finished;
  unsigned long round;
  int stop;
} pool_t;

/* With the lock held: run items of the current round until none is left. */
static void pool_take_items(pool_t *p) {
  while (p->next < p->n) {
    int64_t i = p->next++;
    pthread_mutex_unlock(&p->lock);
    p->task(p->env, i);
    pthread_mutex_lock(&p->lock);
    if (++p->finished == p->n) pthread_cond_broadcast(&p->done);
  }
}

static void *pool_worker(void *arg) {
  pool_t *p = (pool_t *)arg;
  unsigned long seen = 0;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (!p->stop && p->round == seen) pthread_cond_wait(&p->start, &p->lock);
    if (p->stop) break;
    seen = p->round;
    pool_take_items(p);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

static void pool_parallel_for(void *pool, int64_t n, glowgen_task task, void *env) {
  pool_t *p = (pool_t *)pool;
  pthread_mutex_lock(&p->lock);
  p->task = task;
  p->env = env;
  p->n = n;
  p->next = 0;
  p->finished = 0;
  p->round++;
  pthread_cond_broadcast(&p->start);
  pool_take_items(p);
  while (p->finished < p->n) pthread_cond_wait(&p->done, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

static void usage(FILE *f, const char *prog) {
  const glowgen_tensor_info *t;
  int i;
  fprintf(f, "usage: %s [--weights FILE] [--threads N] INPUT_FILE... OUTPUT_FILE...\n", prog);
  fprintf(f, "Runs the model @NAME@ once. Files hold raw tensors: little-endian, row-major, no header.\n");
  fprintf(f, "inputs (%d files to read, in this order):\n", @P@_NUM_INPUTS);
  for (t = @NAME@_inputs; t->name; t++) {
    fprintf(f, "  %-20s %s[", t->name, t->elem_type);
    for (i = 0; i < t->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    fprintf(f, "]  %zu bytes\n", t->size);
  }
  fprintf(f, "outputs (%d files to write, in this order):\n", @P@_NUM_OUTPUTS);
  for (t = @NAME@_outputs; t->name; t++) {
    fprintf(f, "  %-20s %s[", t->name, t->elem_type);
    for (i = 0; i < t->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    fprintf(f, "]  %zu bytes\n", t->size);
  }
  fprintf(f, "options:\n  --weights FILE  the constant weights (default: @NAME@.weights.bin "
             "next to the executable)\n  --threads N     threads to run on (default %d, what the "
             "model was compiled for)\n  -h, --help      this message\n", @P@_THREADS);
}

/* A region of `size` bytes aligned to @P@_ALIGNMENT (aligned_alloc wants a multiple of it). */
static uint8_t *alloc_region(size_t size) {
  size_t rounded = (size + @P@_ALIGNMENT - 1) / @P@_ALIGNMENT * @P@_ALIGNMENT;
  uint8_t *p = aligned_alloc(@P@_ALIGNMENT, rounded ? rounded : @P@_ALIGNMENT);
  if (!p) {
    fprintf(stderr, "error: cannot allocate %zu bytes\n", size);
    exit(2);
  }
  memset(p, 0, rounded ? rounded : @P@_ALIGNMENT);
  return p;
}

/* Reads exactly `size` bytes of `path` into `dst`; the file must have exactly that size. */
static int read_file(const char *path, uint8_t *dst, size_t size, const char *what) {
  FILE *f = fopen(path, "rb");
  long got;
  if (!f) {
    perror(path);
    return 0;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (got = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fprintf(stderr, "error: cannot read %s (%s)\n", path, what);
    fclose(f);
    return 0;
  }
  if ((size_t)got != size) {
    fprintf(stderr, "error: %s has %ld bytes; %s needs exactly %zu\n", path, got, what, size);
    fclose(f);
    return 0;
  }
  if (size && fread(dst, 1, size, f) != size) {
    fprintf(stderr, "error: cannot read %s (%s)\n", path, what);
    fclose(f);
    return 0;
  }
  fclose(f);
  return 1;
}

static int write_file(const char *path, const uint8_t *src, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    return 0;
  }
  if ((size && fwrite(src, 1, size, f) != size) || fclose(f) != 0) {
    fprintf(stderr, "error: cannot write %s\n", path);
    return 0;
  }
  return 1;
}

/* Files are little-endian; on a big-endian machine, swap each element's bytes. */
static void to_native(uint8_t *p, size_t size, size_t elem_size) {
  const uint16_t one = 1;
  size_t i, j;
  if (*(const uint8_t *)&one == 1 || elem_size < 2) return;
  for (i = 0; i + elem_size <= size; i += elem_size)
    for (j = 0; j < elem_size / 2; j++) {
      uint8_t t = p[i + j];
      p[i + j] = p[i + elem_size - 1 - j];
      p[i + elem_size - 1 - j] = t;
    }
}

int main(int argc, char **argv) {
  const char *weights = NULL;
  char *default_weights = NULL;
  const char **files = (const char **)calloc((size_t)argc + 1, sizeof(char *));
  int nfiles = 0, i, status, threads = @P@_THREADS;
  uint8_t *constant, *mutable_, *activations, *out;
  pool_t pool;
  pthread_t *workers = NULL;
  const glowgen_tensor_info *t;

  if (!files) return 2;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout, argv[0]);
      return 0;
    } else if (!strcmp(argv[i], "--weights")) {
      if (++i == argc) {
        fprintf(stderr, "error: --weights needs a file\n");
        return 1;
      }
      weights = argv[i];
    } else if (!strcmp(argv[i], "--threads")) {
      char *end;
      long n;
      if (++i == argc) {
        fprintf(stderr, "error: --threads needs a number\n");
        return 1;
      }
      n = strtol(argv[i], &end, 10);
      if (*end || n < 1 || n > 1024) {
        fprintf(stderr, "error: --threads takes a number from 1 to 1024, not '%s'\n", argv[i]);
        return 1;
      }
      threads = (int)n;
    } else {
      files[nfiles++] = argv[i];
    }
  }
  if (nfiles != @P@_NUM_INPUTS + @P@_NUM_OUTPUTS) {
    fprintf(stderr, "error: expected %d input files and %d output files, got %d files\n",
            @P@_NUM_INPUTS, @P@_NUM_OUTPUTS, nfiles);
    usage(stderr, argv[0]);
    return 1;
  }
  if (!weights) {
    const char *slash = strrchr(argv[0], '/');
    size_t dir = slash ? (size_t)(slash - argv[0]) + 1 : 0;
    default_weights = (char *)malloc(dir + sizeof("@NAME@.weights.bin"));
    if (!default_weights) return 2;
    memcpy(default_weights, argv[0], dir);
    strcpy(default_weights + dir, "@NAME@.weights.bin");
    weights = default_weights;
  }

  constant = alloc_region(@P@_CONSTANT_MEM_SIZE);
  mutable_ = alloc_region(@P@_MUTABLE_MEM_SIZE);
  activations = alloc_region(@P@_ACTIVATIONS_MEM_SIZE);
  if (!read_file(weights, constant, @P@_CONSTANT_MEM_SIZE, "the constant weights")) return 2;
  for (i = 0, t = @NAME@_inputs; t->name; t++, i++) {
    char what[300];
    snprintf(what, sizeof what, "input '%s'", t->name);
    if (!read_file(files[i], mutable_ + t->offset, t->size, what)) return 2;
    to_native(mutable_ + t->offset, t->size, t->elem_size);
  }

  if (threads > 1) {
    memset(&pool, 0, sizeof pool);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.start, NULL);
    pthread_cond_init(&pool.done, NULL);
    workers = (pthread_t *)calloc((size_t)threads - 1, sizeof(pthread_t));
    if (!workers) return 2;
    for (i = 0; i < threads - 1; i++)
      if (pthread_create(&workers[i], NULL, pool_worker, &pool) != 0) {
        fprintf(stderr, "error: cannot start %d threads\n", threads);
        return 2;
      }
    status = @NAME@_parallel(constant, mutable_, activations, pool_parallel_for, &pool);
    pthread_mutex_lock(&pool.lock);
    pool.stop = 1;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    for (i = 0; i < threads - 1; i++) pthread_join(workers[i], NULL);
    free(workers);
  } else {
    status = @NAME@(constant, mutable_, activations);
  }
  if (status != 0) {
    fprintf(stderr, "error: the model returned %d\n", status);
    return 3;
  }

  for (i = @P@_NUM_INPUTS, t = @NAME@_outputs; t->name; t++, i++) {
    out = (uint8_t *)malloc(t->size ? t->size : 1);
    if (!out) return 2;
    memcpy(out, mutable_ + t->offset, t->size);
    to_native(out, t->size, t->elem_size); /* native -> little-endian: the same swap */
    if (!write_file(files[i], out, t->size)) return 2;
    free(out);
  }
  free(constant);
  free(mutable_);
  free(activations);
  free(default_weights);
  free((void *)files);
  return 0;
}
"""


def main_c_text(prog: Program, name: str) -> str:
    width = max([8] + [len(n) for n in list(prog.inputs) + list(prog.outputs)])
    doc = []
    for kind, table in (("input", prog.inputs), ("output", prog.outputs)):
        for tname, w in table.items():
            shown = tname.replace("*/", "* /")
            doc.append(f" *     {kind:6s}  {shown:{width}s}  {w.type.dtype}{list(w.type.shape)}  "
                       f"{w.nbytes} bytes")
    if not doc:
        doc.append(" *     (the model has no inputs and no outputs)")
    return (MAIN_C.replace("@IO_DOC@", "\n".join(doc)).replace("@NAME@", name)
            .replace("@P@", name.upper()))
