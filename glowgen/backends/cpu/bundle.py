"""Ahead-of-time bundles: a model as an object file, its weights and a C header.

`write_bundle(prog, out_dir, target)` writes a compiled program (`glowgen.write_bundle(model,
out_dir)` compiles a model and calls it) as, for NAME (the model file's stem by default):

    NAME.o            the compiled module for the target (position-independent)
    NAME.weights.bin  the constant region, byte for byte as the code expects it
    NAME.h            the entry point, region sizes, alignment, and each input's and
                      output's offset, size, shape and element type in the mutable region
    main.c            an example program: loads the weights, reads inputs from raw files,
                      runs, writes outputs to raw files

Build the example with `gcc -O2 -pthread main.c NAME.o -lm -o NAME`: the object needs nothing
but libm (main.c brings the POSIX threads its `--threads` option runs the model on).

A model compiled for several sets of input shapes is one bundle of shape variants: see
bundle_variants.py.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ...errors import GlowgenError
from ...lir.ir import ALIGNMENT, Program
from .bundle_main import main_c_text, variants_main_c_text

# Names a bundle's entry point must not take: C keywords, `main`, and the C library and libm
# functions that main.c or the generated code link against.
C_KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while _Bool _Complex _Imaginary _Alignas _Alignof _Atomic
_Generic _Noreturn _Static_assert _Thread_local bool true false alignas alignof
""".split())
RESERVED = C_KEYWORDS | frozenset("""
main abort exit free malloc calloc realloc aligned_alloc posix_memalign memcpy memmove memset
memcmp strcmp strlen strrchr strncpy printf fprintf puts fopen fclose fread fwrite fseek ftell
ferror perror errno stdin stdout stderr
exp expf log logf pow powf sqrt sqrtf sin sinf cos cosf tan tanf tanh tanhf erf erff log1p log1pf
expm1 expm1f floor floorf ceil ceilf round roundf fabs fabsf fmod fmodf atan atanf asin asinf acos
acosf sinh sinhf cosh coshf atan2 atan2f fmin fminf fmax fmaxf roundeven roundevenf
""".split())


def c_identifier(text: str) -> str:
    """`text` with every character a C identifier cannot hold replaced by `_`."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if not safe or safe[0].isdigit():
        safe = "m_" + safe
    return safe


def default_name(model) -> str:
    """The model file's stem, identifier-safe and clear of C keywords and libc names."""
    stem = Path(model).stem if isinstance(model, (str, os.PathLike)) else "model"
    name = c_identifier(stem)
    return name + "_model" if name in RESERVED or name.startswith("__") else name


def check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise GlowgenError(f"bundle name {name!r} is not a C identifier (letters, digits and _, "
                           f"not starting with a digit), e.g. {c_identifier(name)!r}")
    if name in RESERVED or name.startswith("__"):
        raise GlowgenError(f"bundle name {name!r} would clash with C or its library (the entry "
                           f"point is a function of that name); choose another with --name, "
                           f"e.g. {name.strip('_') + '_model'!r}")
    return name


def tensor_macro_names(names) -> dict[str, str]:
    """ONNX tensor names -> distinct C-identifier-safe names."""
    out, used = {}, set()
    for n in names:
        base = re.sub(r"[^A-Za-z0-9_]", "_", n) or "t"
        safe, k = base, 1
        while safe in used:
            safe = f"{base}_{k}"
            k += 1
        used.add(safe)
        out[n] = safe
    return out


def constant_bytes(w, big_endian: bool = False) -> bytes:
    """A constant weight's bytes, as the code reads them."""
    if w.nbytes == 0:
        return b""
    data = np.ascontiguousarray(np.asarray(w.data, dtype=w.type.np_dtype).reshape(w.type.shape))
    if big_endian and data.dtype.itemsize > 1:
        data = data.astype(data.dtype.newbyteorder(">"))
    return data.tobytes()


def constant_region(prog: Program, big_endian: bool = False) -> bytes:
    """The constant region's bytes: every constant weight at its offset (zeros between)."""
    region = np.zeros(prog.region_sizes["constant"], np.uint8)
    for w in prog.constant_weights():
        if w.nbytes:
            region[w.offset:w.offset + w.nbytes] = np.frombuffer(constant_bytes(w, big_endian), np.uint8)
    return region.tobytes()


# --------------------------------------------------------------------------- header
def _dims(shape) -> str:
    return "{" + ", ".join(str(d) for d in shape) + "}" if shape else "{0}"


def tensor_macros(prog: Program, P: str) -> list[str]:
    """Each input's and output's offset, size, rank, dims and element type, as macros
    P_INPUT_<name>_OFFSET, ..."""
    L = []
    for kind, table in (("INPUT", prog.inputs), ("OUTPUT", prog.outputs)):
        safe = tensor_macro_names(table)
        for tname, w in table.items():
            m = f"{P}_{kind}_{safe[tname]}"
            ty = w.type
            L += [f"/* {kind.lower()} {tname!r}: {ty.dtype}{list(ty.shape)} */",
                  f"#define {m}_OFFSET {w.offset}",
                  f"#define {m}_SIZE {w.nbytes} /* bytes */",
                  f"#define {m}_RANK {len(ty.shape)}",
                  f"#define {m}_DIMS {_dims(ty.shape)}" + (" /* rank 0: a scalar */" if not ty.shape else ""),
                  f'#define {m}_ELEM_TYPE "{ty.dtype}"',
                  f"#define {m}_ELEM_SIZE {ty.np_dtype.itemsize}", ""]
    return L


# The types every bundle's header shares (guarded: a program may include several headers).
COMMON_TYPES = [
    "#ifndef GLOWGEN_TENSOR_INFO_DEFINED", "#define GLOWGEN_TENSOR_INFO_DEFINED",
    "/* One model input or output, for programs that handle any bundle generically. */",
    "typedef struct {",
    "  const char *name;      /* the ONNX name */",
    "  size_t offset;         /* in the mutable region */",
    "  size_t size;           /* bytes */",
    "  const char *elem_type; /* \"f32\", \"i64\", ... */",
    "  size_t elem_size;      /* bytes per element */",
    "  int rank;",
    "  const int64_t *dims;",
    "} glowgen_tensor_info;", "#endif",
    "#ifndef GLOWGEN_PARALLEL_FOR_DEFINED", "#define GLOWGEN_PARALLEL_FOR_DEFINED",
    "/* Runs task(env, i) for every i in [0, n), in any order, on any threads; returns",
    " * when every call has returned.  Results never depend on which thread runs what. */",
    "typedef void (*glowgen_task)(void *env, int64_t i);",
    "typedef void (*glowgen_parallel_for)(void *pool, int64_t n, glowgen_task task, void *env);",
    "#endif",
    "#ifndef GLOWGEN_UNUSED",
    "#if defined(__GNUC__) || defined(__clang__)",
    "#define GLOWGEN_UNUSED __attribute__((unused))",
    "#else", "#define GLOWGEN_UNUSED", "#endif", "#endif", ""]


def tensor_tables(prog: Program, P: str, prefix: str, counts: str) -> list[str]:
    """The tables prefix_inputs[] and prefix_outputs[] of glowgen_tensor_info, over the
    macros of `tensor_macros(prog, P)`; `counts`_NUM_INPUTS and _NUM_OUTPUTS size them."""
    L = []
    for kind, table in (("INPUT", prog.inputs), ("OUTPUT", prog.outputs)):
        safe = tensor_macro_names(table)
        for tname in table:
            m = f"{P}_{kind}_{safe[tname]}"
            L.append(f"static const int64_t GLOWGEN_UNUSED {prefix}_{kind.lower()}_{safe[tname]}_dims[] = {m}_DIMS;")
    L.append("")
    for kind, table in (("INPUT", prog.inputs), ("OUTPUT", prog.outputs)):
        safe = tensor_macro_names(table)
        L.append(f"/* The {kind.lower()}s in order, then an entry whose name is NULL. */")
        L.append(f"static const glowgen_tensor_info GLOWGEN_UNUSED {prefix}_{kind.lower()}s[{counts}_NUM_{kind}S + 1] = {{")
        for tname in table:
            m = f"{P}_{kind}_{safe[tname]}"
            L.append(f"  {{{_c_string(tname)}, {m}_OFFSET, {m}_SIZE, {m}_ELEM_TYPE, {m}_ELEM_SIZE, "
                     f"{m}_RANK, {prefix}_{kind.lower()}_{safe[tname]}_dims}},")
        L.append("  {0, 0, 0, 0, 0, 0, 0}")
        L.append("};")
    return L


def header_opening(P: str, byte_order: str) -> list[str]:
    """The last lines of a header's leading comment and its opening, the same in every bundle
    (one variant or several)."""
    return [f" * Tensors are dense, row-major (C order), in the target's byte order ({byte_order}-endian).",
            " * Element types: f32 f64 f16 i8 i16 i32 i64 u8 u16 u32 u64 bool (1 byte, 0 or 1),",
            " * bf16 (bfloat16: the high 16 bits of the f32 of the same value).",
            " */",
            f"#ifndef {P}_H", f"#define {P}_H", "",
            "#include <stddef.h>", "#include <stdint.h>", "",
            "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]


def header_text(prog: Program, name: str, *, source: str = "", triple: str = "",
                cpu: str = "", byte_order: str = "little", threads: int = 1) -> str:
    P = name.upper()
    sizes = prog.region_sizes
    max_rank = max([1] + [len(w.type.shape) for w in list(prog.inputs.values()) + list(prog.outputs.values())])
    target = f" for {triple}" + (f" (cpu {cpu})" if cpu else "") if triple else ""
    L = [f"/* {name}.h: generated by glowgen from {source or 'a model'}{target}.",
         " *",
         f" * Entry point: int {name}(uint8_t *constant_weights, uint8_t *mutable_weights,",
         f" *                 {' ' * len(name)}uint8_t *activations);",
         f" *   or, on several threads: int {name}_parallel(.., .., .., parallel_for, pool)",
         " *   with a glowgen_parallel_for (below) that runs task(env, i) for every i in [0, n)",
         " *   on the caller's pool (and on the calling thread) and returns when all are done;",
         f" *   the work was split for {P}_THREADS threads (main.c has a pool on POSIX threads).",
         f" * over three buffers, each aligned to {P}_ALIGNMENT bytes:",
         f" *   constant_weights  {P}_CONSTANT_MEM_SIZE bytes: the contents of {name}.weights.bin (read only)",
         f" *   mutable_weights   {P}_MUTABLE_MEM_SIZE bytes: write each input at its offset before the",
         " *                     call, read each output at its offset after it",
         f" *   activations       {P}_ACTIVATIONS_MEM_SIZE bytes of scratch memory",
         " * It returns 0 on success.  It keeps no state between calls and is reentrant as long as",
         " * concurrent calls use distinct mutable and activation buffers.",
         *header_opening(P, byte_order),
         f"#define {P}_ALIGNMENT {ALIGNMENT}",
         f"#define {P}_CONSTANT_MEM_SIZE {sizes['constant']}",
         f"#define {P}_MUTABLE_MEM_SIZE {sizes['mutable']}",
         f"#define {P}_ACTIVATIONS_MEM_SIZE {sizes['activation']}",
         f"#define {P}_NUM_INPUTS {len(prog.inputs)}",
         f"#define {P}_NUM_OUTPUTS {len(prog.outputs)}",
         f"#define {P}_MAX_RANK {max_rank}",
         f"#define {P}_THREADS {threads} /* the threads its steps were split for */", ""]
    L += tensor_macros(prog, P)
    L += COMMON_TYPES
    L += tensor_tables(prog, P, name, P)
    L += ["", f"int {name}(uint8_t *constant_weights, uint8_t *mutable_weights, uint8_t *activations);",
          f"int {name}_parallel(uint8_t *constant_weights, uint8_t *mutable_weights, uint8_t *activations,",
          f"     {' ' * len(name)}          glowgen_parallel_for parallel_for, void *pool);",
          "", "#ifdef __cplusplus", "}", "#endif", f"#endif /* {P}_H */", ""]
    return "\n".join(L)


def _c_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127 and ch != "?":
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


# --------------------------------------------------------------------------- driver
@dataclass
class Bundle:
    name: str
    directory: Path
    files: list[Path]
    triple: str
    cpu: str
    program: Program             # the first shape variant's, with several
    host: bool
    build_command: str = field(default="")
    variants: list[Program] = field(default_factory=list)   # with several shape variants


def _bundle_target_machine(triple: Optional[str], cpu: Optional[str]):
    """The target machine for an object file.  LLVM only warns (on stderr) about a CPU it does
    not know and then ignores it; a bundle for the wrong CPU is an error here."""
    import sys
    import tempfile
    from .jit import target_machine
    if not cpu:
        return target_machine(triple, cpu, reloc="pic", codemodel="default")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            tm = target_machine(triple, cpu, reloc="pic", codemodel="default")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        warnings = captured.read().decode(errors="replace")
    if "not a recognized processor" in warnings:
        raise GlowgenError(f"--cpu {cpu!r} is not a CPU LLVM knows for {tm.triple}; use e.g. "
                           f"x86-64-v2, x86-64-v3, znver4, skylake-avx512 (x86-64) or "
                           f"cortex-a76, neoverse-v1 (AArch64), or leave --cpu out")
    if warnings.strip():
        sys.stderr.write(warnings)
    return tm


@dataclass
class BundleTarget:
    """Where a bundle's object code runs, settled before the long compilation."""
    machine: object              # llvmlite TargetMachine
    triple: str
    cpu: str
    features: str                # what instruction choices may assume ("" for the baseline)
    host: bool                   # the machine compiling it
    name: str                    # the entry point's, and the files' (a C identifier)
    source: str                  # the model, for the header's comment


def bundle_target(triple: Optional[str] = None, cpu: Optional[str] = None,
                  name: Optional[str] = None, source: Optional[Path] = None) -> BundleTarget:
    """The target for `--target TRIPLE` / `--cpu CPU` (default: this machine) and the bundle's
    NAME (default: the model file's stem), checked."""
    from .jit import host_target
    from .target import ENV
    if cpu is None and triple is None:
        cpu = os.environ.get(ENV) or None      # the default CPU of the JIT too (target.py)
    name = check_name(name) if name is not None else default_name(source or "model")
    tm = _bundle_target_machine(triple, cpu)
    host_triple, host_cpu, host_features = host_target()
    triple = triple or host_triple
    used_cpu = cpu if cpu is not None else (host_cpu if triple == host_triple else "generic")
    # Instruction choices follow the target: this machine's features when compiling for it,
    # none beyond the baseline otherwise (llvmlite cannot list a named CPU's features).
    features = host_features if (triple, used_cpu) == (host_triple, host_cpu) else ""
    from .target import LEVELS, level_features
    if triple.startswith("x86_64") and used_cpu in LEVELS:
        features = level_features(used_cpu)         # an x86-64 level's are known
    return BundleTarget(tm, triple, used_cpu, features, triple == host_triple, name,
                        source.name if source is not None else "an in-memory model")


def _optimized_module(prog: Program, registry, name: str, tm, compile_processes=None):
    """The program's module optimized for `tm`.  A large one is emitted and optimized by
    several processes (parallel_compile.py), their bitcode linked into one module, whose
    step functions are then internal as in a module of one process."""
    import llvmlite.binding as llvm
    from .backend import machine_cores
    from .codegen import ModuleBuilder
    from .jit import optimize
    from .parallel_compile import ProcessesBuild, processes_for

    def new_builder():
        return ModuleBuilder(prog, registry, name)
    processes = processes_for(prog.plan.steps, compile_processes, machine_cores())
    build = ProcessesBuild(new_builder, processes, lambda text: optimize(text, tm).as_bitcode())
    module = optimize(build.text, tm)
    for code in build.objects():
        module.link_in(llvm.parse_bitcode(code))
    for fn_name in build.builder.declared:
        module.get_function(fn_name).linkage = "internal"
    return module


def write_bundle(prog: "Program | list[Program]", registry, out_dir, target: BundleTarget,
                 compile_processes=None) -> Bundle:
    """Write the compiled program `prog`, prepared for `target` (passes.py), as a bundle
    into `out_dir`, its steps split for the threads it was prepared for (the entry
    NAME_parallel takes the caller's pool).  A list of programs, one model compiled for
    several sets of input shapes, is written as one bundle of shape variants
    (bundle_variants.py).  `compile_processes`: as the backend's option of that name."""
    from ..base import prepare_output_dir
    from . import bundle_variants
    from .codegen import ModuleBuilder
    from .jit import optimize

    name, source = target.name, target.source
    variants = prog if isinstance(prog, list) else None
    progs = variants or [prog]
    directory = prepare_output_dir(out_dir)
    tm = target.machine
    big_endian = str(tm.target_data).startswith("E")
    byte_order = "big" if big_endian else "little"
    threads = progs[0].plan.threads
    if variants is None:
        module = _optimized_module(prog, registry, name, tm, compile_processes)
        weights = constant_region(prog, big_endian)
        header = header_text(prog, name, source=source, triple=target.triple, cpu=target.cpu,
                             byte_order=byte_order, threads=threads)
        main_c = main_c_text(prog, name)
    else:
        bundle_variants.check_variants(variants)
        # Constants move to their shared offsets before code generation reads them.
        weights = bundle_variants.share_constants(variants, big_endian)
        module = bundle_variants.link([ModuleBuilder(p, registry, bundle_variants.entry_name(name, k)).build_text()
                                       for k, p in enumerate(variants)])
        module = optimize(module, tm)
        header = bundle_variants.header_text(variants, name, source=source, triple=target.triple,
                                             cpu=target.cpu, byte_order=byte_order, threads=threads)
        main_c = variants_main_c_text(variants, name)
    files = {
        f"{name}.o": tm.emit_object(module),
        f"{name}.weights.bin": weights,
        f"{name}.h": header.encode(),
        "main.c": main_c.encode(),
    }
    written = []
    for fname, data in files.items():
        path = directory / fname
        try:
            path.write_bytes(data)
        except OSError as e:
            raise GlowgenError(f"cannot write {path}: {e.strerror or e}") from None
        written.append(path)
    cc = "gcc" if target.host else f"<a C compiler for {target.triple}>"
    return Bundle(name, directory, written, target.triple, target.cpu, progs[0], target.host,
                  f"{cc} -O2 -pthread main.c {name}.o -lm -o {name}", variants or [])
