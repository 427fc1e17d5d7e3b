"""Unit tests of the GPU check's choice of CUDA headers and libraries
(`gpu_check.choose_cuda`) and of how it reads what drove printed, on fake
site-packages trees laid out as the real wheels are:

  nvidia-cuda-runtime, -nvrtc, -crt, -cccl (CUDA 13): nvidia/cu13/{include,lib}
  nvidia-cuda-runtime-cu12:                          nvidia/cuda_runtime/include
  nvidia-cuda-nvrtc-cu12:                            nvidia/cuda_nvrtc/lib/libnvrtc.so.12
  nvidia-nccl-cu13:                                  nvidia/nccl/lib/libnccl.so.2

Standard library only:  python3 -m unittest discover -s scripts -p 'test_gpu_check.py'
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402


def touch(root, *parts):
    path = os.path.join(root, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return path


def cu13_tree(site, crt=True, cccl=True, nvrtc=True):
    touch(site, "nvidia", "cu13", "include", "cuda_runtime.h")
    touch(site, "nvidia", "cu13", "include", "cuda.h")
    if crt:
        touch(site, "nvidia", "cu13", "include", "crt", "host_config.h")
    if cccl:
        touch(site, "nvidia", "cu13", "include", "cccl", "cuda", "std", "version")
    if nvrtc:
        touch(site, "nvidia", "cu13", "lib", "libnvrtc-builtins.so.13.0")
        return touch(site, "nvidia", "cu13", "lib", "libnvrtc.so.13")
    return None


def cu12_tree(site):
    touch(site, "nvidia", "cuda_runtime", "include", "cuda_runtime.h")
    return touch(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12")


def nccl_wheel(site):
    return touch(site, "nvidia", "nccl", "lib", "libnccl.so.2")


class ChooseCuda(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def site(self, name):
        path = os.path.join(self.root, name, "site-packages")
        os.makedirs(path)
        return path

    def test_without_nvcc_the_cu13_wheels_give_headers_and_nvrtc_even_after_a_cu12_site(self):
        # The cu12 wheels sit in the first site-packages folder searched: a
        # walk in site order would take their libnvrtc.so.12.
        old, new = self.site("a"), self.site("b")
        cu12_tree(old)
        nvrtc13 = cu13_tree(new)
        cu12_tree(new)
        nccl = nccl_wheel(new)
        c = gpu_check.choose_cuda([old, new])
        self.assertEqual(c["cuda_path"], os.path.join(new, "nvidia", "cu13"))
        self.assertEqual(c["cuda_path_from"], "nvidia-cu13 wheels")
        self.assertEqual(c["nvrtc"], nvrtc13)
        self.assertEqual(c["nccl"], nccl)
        self.assertEqual(c["problems"], [])

    def test_an_nvcc_toolkit_gives_its_own_headers_and_nvrtc(self):
        site = self.site("a")
        cu13_tree(site)
        nccl = nccl_wheel(site)
        toolkit = os.path.join(self.root, "cuda-13.0")
        nvcc = touch(toolkit, "bin", "nvcc")
        touch(toolkit, "include", "cuda_runtime.h")
        touch(toolkit, "include", "crt", "host_config.h")
        touch(toolkit, "include", "cccl", "cuda", "std", "version")
        nvrtc = touch(toolkit, "lib64", "libnvrtc.so.13")
        c = gpu_check.choose_cuda([site], nvcc=nvcc)
        self.assertEqual((c["cuda_path"], c["cuda_path_from"]), (toolkit, "nvcc"))
        self.assertEqual(c["nvrtc"], nvrtc)
        self.assertEqual(c["nccl"], nccl)
        self.assertEqual(c["problems"], [])

    def test_a_cuda_path_already_set_wins(self):
        site = self.site("a")
        cu13_tree(site)
        given = os.path.join(self.root, "given")
        touch(given, "include", "cuda_runtime.h")
        c = gpu_check.choose_cuda([site], cuda_path=given)
        self.assertEqual((c["cuda_path"], c["cuda_path_from"]), (given, "CUDA_PATH"))
        # Its folder has no NVRTC: the wheel's is taken, and the split is named.
        self.assertTrue(c["nvrtc"].endswith(os.path.join("cu13", "lib", "libnvrtc.so.13")))
        self.assertTrue(any("not under the header root" in p for p in c["problems"]), c["problems"])

    def test_only_cu12_wheels_give_no_cuda_path_and_say_why(self):
        site = self.site("a")
        nvrtc12 = cu12_tree(site)
        c = gpu_check.choose_cuda([site])
        self.assertIsNone(c["cuda_path"])
        self.assertEqual(c["nvrtc"], nvrtc12)
        self.assertTrue(any("no CUDA headers" in p for p in c["problems"]), c["problems"])
        self.assertTrue(any("libnccl" in p for p in c["problems"]), c["problems"])

    def test_a_cu13_tree_without_crt_or_cccl_names_the_wheels_to_install(self):
        site = self.site("a")
        cu13_tree(site, crt=False, cccl=False)
        nccl_wheel(site)
        c = gpu_check.choose_cuda([site])
        self.assertEqual(c["cuda_path"], os.path.join(site, "nvidia", "cu13"))
        text = " ".join(c["problems"])
        self.assertIn("nvidia-cuda-crt", text)
        self.assertIn("nvidia-cuda-cccl", text)

    def test_cu13_headers_with_only_a_cu12_nvrtc_are_named(self):
        site = self.site("a")
        cu13_tree(site, nvrtc=False)
        cu12_tree(site)
        nccl_wheel(site)
        c = gpu_check.choose_cuda([site])
        self.assertTrue(c["nvrtc"].endswith("libnvrtc.so.12"))
        self.assertTrue(any("CUDA 12's" in p for p in c["problems"]), c["problems"])


class ReadingOutput(unittest.TestCase):
    def test_rank_prefixed_json_lines_are_read_by_rank(self):
        out = '[1] {"rank": 1}\n[0] note\n[0] {"rank": 0, "x": 2}\nplain\n'
        self.assertEqual(gpu_check.json_lines(out), {0: {"rank": 0, "x": 2}, 1: {"rank": 1}})
        self.assertEqual(gpu_check.json_lines('{"alone": true}\n'), {0: {"alone": True}})
        self.assertEqual(gpu_check.json_lines("[x] {}\n{not json\n"), {})

    def test_checkpoints_compare_as_the_rust_tests_do_with_numpy_or_without(self):
        from array import array
        from unittest import mock
        a = {"w": array("f", [1.0, -4.0]).tobytes(), "b": array("f", [0.5]).tobytes()}
        b = {"w": array("f", [1.0, -4.0002]).tobytes(), "b": array("f", [0.5]).tobytes()}
        # Without numpy (the import fails) and, where it is installed, with it.
        for hide in (True, False):
            with mock.patch.dict(sys.modules, {"numpy": None} if hide else {}):
                d = gpu_check.relative_difference(a, b)
                self.assertAlmostEqual(d, 0.0002 / 4.0, places=6)
                self.assertEqual(gpu_check.relative_difference(a, a), 0.0)
                with self.assertRaises(ValueError):
                    gpu_check.relative_difference(a, {"w": a["w"]})


if __name__ == "__main__":
    unittest.main()
