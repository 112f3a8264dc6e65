"""Run inside the trainer image (`python3 - < jit_probe.py`): compile and import a C extension the way Triton's
build helper does for its `cuda_utils` module and kernel launchers on first use (Triton 3.6 on Linux: the compiler
from $CC, else clang, else gcc; `-O3 -shared -fPIC -Wno-psabi` against the interpreter's Python.h; loaded with
importlib). Prints the extension's answer; fails as Triton would ("Failed to find C compiler") without a compiler.
"""

import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile

SOURCE = r"""
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "jit_probe_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_jit_probe_ext(void) { return PyModule_Create(&module); }
"""

cc = os.environ.get("CC") or shutil.which("clang") or shutil.which("gcc")
if cc is None:
    raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
scheme = sysconfig.get_default_scheme()
if scheme == "posix_local":  # Debian's default scheme; the headers live under posix_prefix
    scheme = "posix_prefix"
include = sysconfig.get_paths(scheme=scheme)["include"]
with tempfile.TemporaryDirectory(dir="/scratch" if os.access("/scratch", os.W_OK) else None) as work:
    src = os.path.join(work, "jit_probe_ext.c")
    with open(src, "w") as fh:
        fh.write(SOURCE)
    so = os.path.join(work, "jit_probe_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.check_call([cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, f"-I{include}"])
    spec = importlib.util.spec_from_file_location("jit_probe_ext", so)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    print(f"compiled with {cc} against {include}: answer {ext.answer()}")
