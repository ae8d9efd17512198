"""Pack the wheels a GPU machine without a package index needs for the kernel DSLs into one
compressed file per language, small enough to travel with a device call (64 MiB in all, the
working tree and the project's own wheels included): CuTe DSL, cuTile (with the tileiras
compiler for Hopper) and TileLang.

Usage: python3 -m benchmarks.dsl_bundle WHEELS_DIR [--out DIR] [--only tilelang cutile cute_dsl] [--split-mib 40]

WHEELS_DIR holds the wheels (``pip download --no-deps`` for Python 3.12, x86_64). For each
language this unpacks its wheels into one folder, as ``pip install --no-deps --target`` would
(no console scripts are needed), drops what neither the DSL nor its compiler uses (a second copy
of libz3 and the z3 program; nvcc, nvlink, cicc and the other CUDA tools that tileiras does not
call; QNX and aarch64 stubs), compresses it with xz (a 256 MiB dictionary, one thread: minutes)
and writes DIR/<language>/site.tar.xz (DIR: --out, else WHEELS_DIR). With ``--split-mib`` a
bundle larger than that is cut into DIR/<language>-1/site.tar.xz.part-01,
DIR/<language>-2/site.tar.xz.part-02, ... (a folder for each device call that carries a part).
On the GPU machine, once every part is there:

    cat .whl-dsl/<language>*/site.tar.xz* | tar -xJf - -C /tmp/site
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# language -> (wheel name prefixes: needed, used where present; paths to delete after unpacking;
# (link, target) symlinks to make)
BUNDLES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "tilelang": (
        ("tilelang-", "apache_tvm_ffi-", "torch_c_dlpack_ext-", "z3_solver-"),
        (),
        ("z3_solver-*.data", "z3/lib/libz3.so"),
        (("z3/lib/libz3.so", "libz3.so.4.15"),),
    ),
    "cutile": (
        ("cuda_tile-", "nvidia_cuda_tileiras-", "nvidia_cuda_nvcc-", "nvidia_nvvm-"),
        (),
        tuple(
            f"nvidia/cu13/bin/{n}"
            for n in (
                "nvcc",
                "nvlink",
                "cudafe++",
                "fatbinary",
                "bin2c",
                "__nvcc_device_query",
                "crt",
                "nvcc.profile",
                "tileirdisasm",
            )
        )
        + ("nvidia/cu13/nvvm/bin",),
        (),
    ),
    "cute_dsl": (  # one wheel up to 4.3; from 4.4 a small one and its libraries
        ("nvidia_cutlass_dsl-",),
        ("nvidia_cutlass_dsl_libs_base-", "nvidia_cutlass_dsl_libs_core-", "nvidia_cutlass_dsl_libs_cu13-"),
        ("nvidia_cutlass_dsl/cu13/lib/stubs",),
        (),
    ),
}


def wheels_for(wheels: Path, needed: tuple[str, ...], optional: tuple[str, ...]) -> list[Path]:
    found = []
    for prefix in needed + optional:
        matches = sorted(wheels.glob(f"{prefix}*.whl"))
        if len(matches) > 1 or (not matches and prefix in needed):
            raise SystemExit(f"{wheels}: expected one wheel {prefix}*.whl, found {[m.name for m in matches]}")
        found += matches
    return found


def unpack(wheel_files: list[Path], site: Path) -> None:
    for w in wheel_files:
        with zipfile.ZipFile(w) as z:
            for info in z.infolist():
                path = z.extract(info, site)
                mode = info.external_attr >> 16
                if mode & 0o111:  # keep the compilers executable
                    os.chmod(path, mode & 0o777)


def trim(site: Path, drop: tuple[str, ...], links: tuple[tuple[str, str], ...]) -> None:
    for pattern in drop:
        for p in site.glob(pattern):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for link, target in links:
        (site / link).symlink_to(target)


def pack(site: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        # one thread and a dictionary as large as a bundle: tileiras and libnvvm share code
        # further apart than the 64 MiB of xz -9 (cuTile: 55.4 MiB instead of 57.2)
        xz = subprocess.run(["xz", "-T1", "--lzma2=preset=9e,dict=256MiB"], stdin=tar.stdout, stdout=f, check=True)
        tar.stdout.close()
        if tar.wait() or xz.returncode:
            raise SystemExit(f"packing {out} failed")


def split(bundle: Path, mib: int) -> list[Path]:
    """Cut ``bundle`` (LANG/site.tar.xz) into parts of ``mib`` MiB, part n in a folder of its own,
    LANG-n, so that each can be carried by a call of its own and ``LANG*`` lists them in order."""
    data = bundle.read_bytes()
    size = mib * 2**20
    if len(data) <= size:
        return [bundle]
    parts = []
    for n, i in enumerate(range(0, len(data), size)):
        folder = bundle.parent.with_name(f"{bundle.parent.name}-{n + 1}")
        folder.mkdir(exist_ok=True)
        part = folder / f"{bundle.name}.part-{n + 1:02d}"
        part.write_bytes(data[i : i + size])
        parts.append(part)
    bundle.unlink()
    bundle.parent.rmdir()
    return parts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheels", type=Path)
    ap.add_argument("--out", type=Path, help="where the bundles go (default: the wheels' folder)")
    ap.add_argument("--only", nargs="+", choices=list(BUNDLES), default=list(BUNDLES))
    ap.add_argument("--split-mib", type=int, default=0, help="cut bundles larger than this (0: never)")
    args = ap.parse_args()
    for lang in args.only:
        needed, optional, drop, links = BUNDLES[lang]
        files = wheels_for(args.wheels, needed, optional)
        out_dir = args.out or args.wheels
        with tempfile.TemporaryDirectory(prefix=f"dsl-bundle-{lang}-") as tmp:
            site = Path(tmp) / "site"
            unpack(files, site)
            trim(site, drop, links)
            out = out_dir / lang / "site.tar.xz"
            for stale in [out_dir / lang, *out_dir.glob(f"{lang}-[0-9]*")]:
                shutil.rmtree(stale, ignore_errors=True)
            pack(site, out)
        parts = split(out, args.split_mib) if args.split_mib else [out]
        wheels_mib = sum(f.stat().st_size for f in files) / 2**20
        for p in parts:
            print(f"{lang}: {p} {p.stat().st_size / 2**20:.1f} MiB", flush=True)
        print(f"{lang}: from {len(files)} wheels of {wheels_mib:.1f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
