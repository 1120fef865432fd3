"""The example program a bundle ships: main.c loads the weights, reads each input from a raw
file, runs the entry point (on POSIX threads with --threads N) and writes each output."""
from __future__ import annotations

from ...lir.ir import Program

SINGLE_DOC = r"""/* main.c: run the glowgen bundle `@NAME@` once, on inputs read from raw binary files.
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
"""

POOL = r"""#include <pthread.h>
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

/* The pool and its threads - 1 workers (NULL, said on stderr, when they cannot start). */
static pthread_t *pool_start(pool_t *p, int threads) {
  pthread_t *workers;
  int i;
  memset(p, 0, sizeof *p);
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  workers = (pthread_t *)calloc((size_t)threads - 1, sizeof(pthread_t));
  if (!workers) return NULL;
  for (i = 0; i < threads - 1; i++)
    if (pthread_create(&workers[i], NULL, pool_worker, p) != 0) {
      fprintf(stderr, "error: cannot start %d threads\n", threads);
      return NULL;
    }
  return workers;
}

static void pool_stop(pool_t *p, pthread_t *workers, int threads) {
  int i;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->lock);
  for (i = 0; i < threads - 1; i++) pthread_join(workers[i], NULL);
  free(workers);
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

"""

SINGLE_USAGE = r"""static void usage(FILE *f, const char *prog) {
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

"""

HELPERS = r"""/* A region of `size` bytes aligned to @P@_ALIGNMENT (aligned_alloc wants a multiple of it). */
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

"""

# The end of both main.c's option loops: --threads N, anything else an input or output file,
# then the count of files checked.
THREADS_AND_FILES = r"""    } else if (!strcmp(argv[i], "--threads")) {
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
"""

SINGLE_MAIN = r"""int main(int argc, char **argv) {
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
""" + THREADS_AND_FILES + r"""  if (!weights) {
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
    workers = pool_start(&pool, threads);
    if (!workers) return 2;
    status = @NAME@_parallel(constant, mutable_, activations, pool_parallel_for, &pool);
    pool_stop(&pool, workers, threads);
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

MAIN_C = SINGLE_DOC + POOL + SINGLE_USAGE + HELPERS + SINGLE_MAIN


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


# --------------------------------------------------------------------------- shape variants
VARIANTS_DOC = r"""/* main.c: run the glowgen bundle `@NAME@` once, on inputs read from raw binary files.
 *
 * Build:  gcc -O2 -pthread main.c @NAME@.o -lm -o @NAME@
 * Usage:  ./@NAME@ [--weights FILE] [--threads N] [--shape NAME=DIMS]... INPUT_FILE... OUTPUT_FILE...
 *   one file per model input, in order, then one file per model output, in order.
 * The bundle holds the model compiled for @P@_NUM_VARIANTS sets of input shapes (its variants):
@IO_DOC@
 *   `./@NAME@ --help` prints the same list.
 * Each input's shape is the one --shape NAME=DIMS gives (e.g. --shape x=4x3x32x32), or else
 * the shape the variants give that input for its file's size, when that is one shape.
 * @NAME@_select_variant picks the variant compiled for these shapes, and @NAME@_run runs it.
 * Every file holds raw tensor data: little-endian, row-major (C order), no header; an input
 * file must hold exactly the input's size in bytes.  With numpy:
 *   x.astype("<f4").tofile("input.bin")      np.fromfile("output.bin", "<f4").reshape(shape)
 * The weights are read from @NAME@.weights.bin in the executable's directory (or the current
 * directory when the executable was found through PATH) unless --weights FILE is given.
 * --threads N runs the model on N threads (default @P@_THREADS, what it was compiled for):
 * a small pool on POSIX threads (pool_parallel_for below) that @NAME@_run_parallel hands
 * its split steps to.  The answer is the same bit for bit for any N.
 * Exit status: 0 on success, 1 for bad usage, 2 for a file error, 3 if the model fails,
 * 4 if no variant was compiled for the inputs' shapes.
 */
"""

VARIANTS_USAGE = r"""static void print_tensor(FILE *f, const glowgen_tensor_info *t) {
  int i;
  fprintf(f, "    %-20s %s[", t->name, t->elem_type);
  for (i = 0; i < t->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
  fprintf(f, "]  %zu bytes\n", t->size);
}

static void print_variants(FILE *f) {
  const glowgen_variant_info *v;
  const glowgen_tensor_info *t;
  for (v = @NAME@_variants; v->inputs; v++) {
    fprintf(f, "variant %d: inputs (files to read, in this order)\n", (int)(v - @NAME@_variants));
    for (t = v->inputs; t->name; t++) print_tensor(f, t);
    fprintf(f, "  outputs (files to write, in this order)\n");
    for (t = v->outputs; t->name; t++) print_tensor(f, t);
  }
}

static void usage(FILE *f, const char *prog) {
  fprintf(f, "usage: %s [--weights FILE] [--threads N] [--shape NAME=DIMS]... INPUT_FILE... "
             "OUTPUT_FILE...\n", prog);
  fprintf(f, "Runs the model @NAME@ once, on the variant compiled for the inputs' shapes. Files "
             "hold raw tensors: little-endian, row-major, no header.\n");
  print_variants(f);
  fprintf(f, "options:\n  --shape NAME=DIMS  input NAME's shape, e.g. 4x3x32x32 (default: the "
             "shape of the variant whose input has the file's size)\n  --weights FILE     the "
             "constant weights (default: @NAME@.weights.bin next to the executable)\n  "
             "--threads N        threads to run on (default %d, what the model was compiled "
             "for)\n  -h, --help         this message\n", @P@_THREADS);
}

/* `path`'s size in bytes, or -1 (with a message) if it cannot be read. */
static long file_size(const char *path) {
  FILE *f = fopen(path, "rb");
  long size = -1;
  if (!f) {
    perror(path);
    return -1;
  }
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0) fprintf(stderr, "error: cannot read %s\n", path);
  fclose(f);
  return size;
}

/* Parses DIMS ("4x3x32x32", or "4,3,32,32") into dims; returns the rank, or -1. */
static int parse_dims(const char *text, int64_t *dims) {
  int rank = 0;
  char *end;
  if (!*text) return -1;
  for (;;) {
    long long d = strtoll(text, &end, 10);
    if (end == text || d < 0 || rank == @P@_MAX_RANK) return -1;
    dims[rank++] = (int64_t)d;
    if (!*end) return rank;
    if (*end != 'x' && *end != ',') return -1;
    text = end + 1;
  }
}

"""

VARIANTS_MAIN = r"""int main(int argc, char **argv) {
  const char *weights = NULL;
  char *default_weights = NULL;
  const char **files = (const char **)calloc((size_t)argc + 1, sizeof(char *));
  const char **shapes = (const char **)calloc((size_t)argc + 1, sizeof(char *));
  int nfiles = 0, nshapes = 0, i, j, k, status, threads = @P@_THREADS, variant;
  int ranks[@P@_NUM_INPUTS + 1], given[@P@_NUM_INPUTS + 1];
  int64_t dims[@P@_NUM_INPUTS + 1][@P@_MAX_RANK];
  const int64_t *dims_of[@P@_NUM_INPUTS + 1];
  uint8_t *constant, *mutable_, *activations, *out;
  pool_t pool;
  pthread_t *workers = NULL;
  const glowgen_tensor_info *t;
  const glowgen_variant_info *v;

  if (!files || !shapes) return 2;
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
    } else if (!strcmp(argv[i], "--shape")) {
      if (++i == argc) {
        fprintf(stderr, "error: --shape needs NAME=DIMS, e.g. --shape %s=%s\n",
                @NAME@_variants[0].inputs[0].name ? @NAME@_variants[0].inputs[0].name : "x", "1x3x32x32");
        return 1;
      }
      shapes[nshapes++] = argv[i];
""" + THREADS_AND_FILES + r"""
  /* Each input's shape: from --shape, or from its file's size. */
  memset(given, 0, sizeof given);
  for (k = 0; k < nshapes; k++) {
    const char *eq = strrchr(shapes[k], '=');
    size_t len = eq ? (size_t)(eq - shapes[k]) : 0;
    for (i = 0, t = @NAME@_variants[0].inputs; t->name; t++, i++)
      if (eq && strlen(t->name) == len && !strncmp(t->name, shapes[k], len)) break;
    if (!eq || !t->name) {
      fprintf(stderr, "error: --shape '%s' names no input of @NAME@; write NAME=DIMS with NAME one of:",
              shapes[k]);
      for (t = @NAME@_variants[0].inputs; t->name; t++) fprintf(stderr, " '%s'", t->name);
      fprintf(stderr, "\n");
      return 1;
    }
    if ((ranks[i] = parse_dims(eq + 1, dims[i])) < 0) {
      fprintf(stderr, "error: --shape '%s': write DIMS as 4x3x32x32, of at most %d dimensions\n",
              shapes[k], @P@_MAX_RANK);
      return 1;
    }
    given[i] = 1;
  }
  for (i = 0; i < @P@_NUM_INPUTS; i++) {
    const glowgen_tensor_info *found = NULL;
    long size;
    dims_of[i] = dims[i];
    if (given[i]) continue;
    if ((size = file_size(files[i])) < 0) return 2;
    for (v = @NAME@_variants; v->inputs; v++) {
      t = &v->inputs[i];
      if ((long)t->size != size) continue;
      if (found && (found->rank != t->rank ||
                    memcmp(found->dims, t->dims, (size_t)t->rank * sizeof(int64_t)))) {
        fprintf(stderr, "error: %s has %ld bytes, the size of several shapes of input '%s'; "
                        "say which with --shape %s=DIMS\n", files[i], size, t->name, t->name);
        return 1;
      }
      found = t;
    }
    if (!found) {
      fprintf(stderr, "error: %s has %ld bytes, but no variant of @NAME@ takes an input '%s' of "
                      "that size\n", files[i], size, @NAME@_variants[0].inputs[i].name);
      print_variants(stderr);
      return 4;
    }
    ranks[i] = found->rank;
    for (j = 0; j < found->rank; j++) dims[i][j] = found->dims[j];
  }
  variant = @NAME@_select_variant(ranks, dims_of);
  if (variant == @P@_NO_VARIANT) {
    fprintf(stderr, "error: no variant of @NAME@ was compiled for the input shapes");
    for (i = 0; i < @P@_NUM_INPUTS; i++) {
      fprintf(stderr, "%s %s[", i ? "," : "", @NAME@_variants[0].inputs[i].name);
      for (j = 0; j < ranks[i]; j++) fprintf(stderr, "%s%lld", j ? ", " : "", (long long)dims[i][j]);
      fprintf(stderr, "]");
    }
    fprintf(stderr, "; recompile with them (glowgen compile --input-shape) or use one of:\n");
    print_variants(stderr);
    return 4;
  }
  v = &@NAME@_variants[variant];

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
  mutable_ = alloc_region(v->mutable_mem_size);
  activations = alloc_region(v->activations_mem_size);
  if (!read_file(weights, constant, @P@_CONSTANT_MEM_SIZE, "the constant weights")) return 2;
  for (i = 0, t = v->inputs; t->name; t++, i++) {
    char what[300];
    snprintf(what, sizeof what, "input '%s' of variant %d", t->name, variant);
    if (!read_file(files[i], mutable_ + t->offset, t->size, what)) return 2;
    to_native(mutable_ + t->offset, t->size, t->elem_size);
  }

  if (threads > 1) {
    workers = pool_start(&pool, threads);
    if (!workers) return 2;
    status = @NAME@_run_parallel(variant, constant, mutable_, activations, pool_parallel_for, &pool);
    pool_stop(&pool, workers, threads);
  } else {
    status = @NAME@_run(variant, constant, mutable_, activations);
  }
  if (status != 0) {
    fprintf(stderr, "error: the model returned %d\n", status);
    return 3;
  }

  for (i = @P@_NUM_INPUTS, t = v->outputs; t->name; t++, i++) {
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
  free((void *)shapes);
  return 0;
}
"""


def variants_main_c_text(progs: list[Program], name: str) -> str:
    """main.c of a bundle of shape variants: it takes inputs of any variant's shapes."""
    doc = []
    for k, prog in enumerate(progs):
        doc.append(f" *   variant {k} ({name}_v{k}):")
        width = max([8] + [len(n) for n in list(prog.inputs) + list(prog.outputs)])
        for kind, table in (("input", prog.inputs), ("output", prog.outputs)):
            for tname, w in table.items():
                shown = tname.replace("*/", "* /")
                doc.append(f" *     {kind:6s}  {shown:{width}s}  {w.type.dtype}{list(w.type.shape)}  "
                           f"{w.nbytes} bytes")
    text = VARIANTS_DOC + POOL + VARIANTS_USAGE + HELPERS + VARIANTS_MAIN
    return (text.replace("@IO_DOC@", "\n".join(doc)).replace("@NAME@", name)
            .replace("@P@", name.upper()))
