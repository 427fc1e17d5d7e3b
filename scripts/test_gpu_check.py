"""Unit tests of the GPU check's choice of CUDA headers and libraries
(`gpu_check.choose_cuda`), of how it reads what drove printed, of its budget
(`phase_deadline`, `fit_steps`), of its summaries (`story_verdict`,
`first_step_summary`, `targets`) and of how it stops a command past its
deadline (`run_bounded`), on fake site-packages trees laid out as the real
wheels are:

  nvidia-cuda-runtime, -nvrtc, -crt, -cccl (CUDA 13): nvidia/cu13/{include,lib}
  nvidia-cuda-runtime-cu12:                          nvidia/cuda_runtime/include
  nvidia-cuda-nvrtc-cu12:                            nvidia/cuda_nvrtc/lib/libnvrtc.so.12
  nvidia-nccl-cu13:                                  nvidia/nccl/lib/libnccl.so.2

Standard library only:  python3 -m unittest discover -s scripts -p 'test_gpu_check.py'
"""

import json
import os
import subprocess
import sys
import tempfile
import time
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

    def test_step_scales_compare_relative_and_see_a_doubled_gradient(self):
        a = [{"step": 1, "global_loss": 2.0, "grad_norm": 4.0}, {"step": 2, "global_loss": 1.0, "grad_norm": 3.0}]
        b = [{"step": 1, "global_loss": 2.0, "grad_norm": 4.0004}, {"step": 2, "global_loss": 1.0, "grad_norm": 3.0}]
        self.assertAlmostEqual(gpu_check.scale_difference(a, b), 0.0004 / 4.0004, places=9)
        doubled = [dict(x, grad_norm=2 * x["grad_norm"]) for x in a]
        self.assertAlmostEqual(gpu_check.scale_difference(a, doubled), 0.5)
        self.assertGreater(gpu_check.scale_difference(a, doubled), gpu_check.SCALE_BOUND)
        for bad in (None, [], a[:1], [dict(a[0], grad_norm=None), a[1]]):
            with self.assertRaises((ValueError, TypeError)):
                gpu_check.scale_difference(a, bad)


class Budget(unittest.TestCase):
    PLAN = (("a", 100, 40), ("b", 60, 20), ("c", 30, 10))

    def test_a_phase_gets_its_cap_when_time_is_plenty(self):
        self.assertEqual(gpu_check.phase_deadline("a", 1000, self.PLAN), 100)
        self.assertEqual(gpu_check.phase_deadline("c", 1000, self.PLAN), 30)

    def test_a_phase_leaves_the_floors_of_the_phases_after_it(self):
        # 120 left: 5 for the end, 20 + 10 for b and c.
        self.assertEqual(gpu_check.phase_deadline("a", 120, self.PLAN), 120 - 5 - 30)
        self.assertEqual(gpu_check.phase_deadline("b", 50, self.PLAN), 50 - 5 - 10)
        # A phase that will not run keeps nothing back.
        self.assertEqual(gpu_check.phase_deadline("a", 110, self.PLAN, skip=("b",)), 110 - 5 - 10)

    def test_never_below_zero_and_phases_not_planned_get_what_is_left(self):
        self.assertEqual(gpu_check.phase_deadline("a", 10, self.PLAN), 0)
        self.assertEqual(gpu_check.phase_deadline("f1", 200, self.PLAN), 195)
        self.assertEqual(gpu_check.phase_deadline("f1", 2, self.PLAN), 0)

    def test_the_important_phases_fit_the_default_budget(self):
        floors = sum(f for _, _, f in gpu_check.PLAN) + gpu_check.FINAL_RESERVE_S
        self.assertLessEqual(floors, 300, "the floors leave room for setup and overruns in 400 s")
        self.assertEqual([n for n, _, _ in gpu_check.PLAN][:5],
                         ["drove_b32", "pytorch_b32", "drove_warm", "drove_b256", "pytorch_b256"])
        # With 385 s left after setup, the first phase gets its whole cap.
        self.assertEqual(gpu_check.phase_deadline("drove_b32", 385), 110)

    def test_batch_256_steps_fit_the_deadline_from_the_batch_32_run(self):
        self.assertEqual(gpu_check.fit_steps(300, 10, 256, 80, None), (300, None))
        self.assertEqual(gpu_check.fit_steps(300, 10, 256, 80, "not run"), (300, None))
        fast = {"sentences_per_s": 4000, "wall_seconds_including_load": 20, "step_mean_seconds": 0.008,
                "steps_timed": 300}
        self.assertEqual(gpu_check.fit_steps(300, 10, 256, 80, fast), (300, None))
        # 400 sentences/s: 0.64 s a step of 256; 45 - 24 = 21 s untimed; 0.8 * 80 = 64 s.
        slow = {"sentences_per_s": 400, "wall_seconds_including_load": 45, "step_mean_seconds": 0.08,
                "steps_timed": 300}
        steps, why = gpu_check.fit_steps(300, 10, 256, 80, slow)
        self.assertEqual(steps, int((64 - 21) / 0.64) - 10)
        self.assertIn("would not fit", why)
        # Never below the minimum, however slow.
        self.assertEqual(gpu_check.fit_steps(300, 10, 256, 80, {**slow, "sentences_per_s": 40})[0], 30)
        # Without timing fields: 30 s untimed assumed.
        self.assertEqual(gpu_check.fit_steps(300, 10, 256, 80, {"sentences_per_s": 400})[0], int(34 / 0.64) - 10)


def agreement(mean, verdict, steps=2, expected=0.745, sigma=0.004):
    return {"world_size": 4, "probability": 0.15, "steps": steps, "pairs": [], "matrix": [],
            "mean_agreement": mean, "expected": expected, "sigma": sigma,
            "normalised": (mean - expected) / (1 - expected), "within_3_sigma": abs(mean - expected) <= 3 * sigma,
            "verdict": verdict}


def ner_summary(agree, alarm):
    return {"world_size": 4, "steps": 12, "evaluations": [], "test_f1": None, "mask_agreement": agree,
            "grad_cosine": 0.9, "diversity_alarm": alarm, "sentences_per_s": 100.0, "tokens_per_s": 1.0,
            "train_seconds": 1.0, "checkpoint": None, "exit_code": 0}


class Story(unittest.TestCase):
    ALARM = "step 5: Identical masks: agreement 1.0000 is 63.7 sigma above the 0.7450 of independent masks."

    def test_naive_identical_with_the_alarm_and_derived_diverse_without_pass(self):
        v = gpu_check.story_verdict(ner_summary(agreement(1.0, "identical"), self.ALARM),
                                    ner_summary(agreement(0.747, "diverse"), None))
        self.assertTrue(v["pass"], v)
        self.assertEqual((v["naive"]["agreement"], v["naive"]["verdict"]), (1.0, "identical"))
        self.assertTrue(v["naive"]["alarm"].startswith("step 5"))
        self.assertAlmostEqual(v["derived"]["z"], 0.5)
        self.assertIsNone(v["derived"]["alarm"])
        json.dumps(v)

    def test_each_way_the_story_can_fail_is_named(self):
        derived = ner_summary(agreement(0.747, "diverse"), None)
        # Naive without the alarm, or below 1.0.
        for naive in (ner_summary(agreement(1.0, "identical"), None),
                      ner_summary(agreement(0.9, "identical"), self.ALARM)):
            v = gpu_check.story_verdict(naive, derived)
            self.assertFalse(v["pass"])
            self.assertFalse(v["naive"]["pass"])
            self.assertIn("naive seeding should", v["naive"]["why"])
        naive = ner_summary(agreement(1.0, "identical"), self.ALARM)
        # Derived outside the band, or with the alarm.
        for bad in (ner_summary(agreement(0.80, "identical"), self.ALARM),
                    ner_summary(agreement(0.745, "diverse"), "step 5: something")):
            v = gpu_check.story_verdict(naive, bad)
            self.assertFalse(v["pass"])
            self.assertIn("3 sigma", v["derived"]["why"])
        # A run that gave nothing, or diagnosed nothing (mask_agreement null), and NaN as null.
        v = gpu_check.story_verdict(None, ner_summary(None, None))
        self.assertFalse(v["pass"])
        self.assertIn("no summary", v["naive"]["why"])
        self.assertIn("no step was diagnosed", v["derived"]["why"])
        v = gpu_check.story_verdict(ner_summary(agreement(1.0, "identical"), self.ALARM),
                                    ner_summary({**agreement(0.7, "diverse"), "mean_agreement": None}, None))
        self.assertFalse(v["derived"]["pass"])
        self.assertEqual(gpu_check.story_verdict(None, None, skipped="no weights")["pass"], None)

    def test_the_story_runs_four_ranks_of_32_for_12_steps_staged_through_the_host(self):
        args = gpu_check.story_args("naive", "D", "M", "O", ["--random-init"])
        flag = lambda name: args[args.index(name) + 1]
        self.assertEqual(args[:2], ["train", "ner"])
        self.assertEqual((flag("--device"), flag("--gradient-path"), flag("--seeding")), ("cuda:0", "host", "naive"))
        self.assertEqual((flag("--max-steps"), flag("--batch-size"), flag("--max-train-sentences")),
                         ("12", "32", str(4 * 32 * 12)))
        self.assertEqual((flag("--augment-mask"), flag("--diagnose-every"), flag("--eval")), ("0.15", "5", ""))
        self.assertIn("--json", args)
        self.assertEqual(args[-1], "--random-init")


def bench(sps, peak=None, first=None, **more):
    run = {"sentences_per_s": sps, "first_step_seconds": first, **more}
    if peak is not None:
        run["gpu_memory_sampled"] = {"peak_used_mib": peak + 500, "idle_used_mib": 500, "peak_over_idle_mib": peak}
    return run


class Summaries(unittest.TestCase):
    def test_targets_from_every_phase(self):
        data = {"drove_b32": bench(2000, peak=1800, kernels_launched_per_step=310.0),
                "pytorch_b32": bench(1800, peak=1900),
                "drove_b256": bench(5000, peak=9000), "pytorch_b256": bench(6000, peak=8000),
                "drove_warm_first_step_seconds": 1.5}
        t = gpu_check.targets(data)
        self.assertAlmostEqual(t["b32_ratio"]["ratio"], 2000 / 1800)
        self.assertTrue(t["b32_ratio"]["met"])
        self.assertEqual(t["b32_ratio"]["kernels_launched_per_step"], 310.0)
        self.assertFalse(t["b256_ratio"]["met"])
        self.assertEqual((t["warm_first_step"]["seconds"], t["warm_first_step"]["met"]), (1.5, True))
        self.assertEqual(t["peak_memory"]["b32"], {"drove_mib": 1800, "pytorch_mib": 1900, "met": True})
        self.assertFalse(t["peak_memory"]["b256"]["met"])
        self.assertFalse(t["peak_memory"]["met"])
        self.assertFalse(t["all_met"])
        json.dumps(t)

    def test_targets_not_measured_are_null_not_false(self):
        t = gpu_check.targets({"drove_b32": None, "pytorch_b32": bench(1800), "drove_b256": "not run",
                               "drove_warm_first_step_seconds": None})
        self.assertIsNone(t["b32_ratio"]["ratio"])
        self.assertIsNone(t["b32_ratio"]["met"])
        self.assertIsNone(t["b256_ratio"]["met"])
        self.assertIsNone(t["warm_first_step"]["met"])
        self.assertIsNone(t["peak_memory"]["met"])
        self.assertIsNone(t["all_met"])
        # Memory measured at one batch only decides on that one.
        t = gpu_check.targets({"drove_b32": bench(1, peak=10), "pytorch_b32": bench(1, peak=20)})
        self.assertTrue(t["peak_memory"]["met"])
        self.assertIsNone(t["peak_memory"]["b256"]["met"])

    def test_the_first_step_cold_and_warm_side_by_side(self):
        f = gpu_check.first_step_summary(bench(1, first=9.5, kernels_compiled=412, kernel_cache="/w/kcache"),
                                         bench(1, first=2.1, kernels_compiled=0))
        self.assertEqual((f["first_step_cold_s"], f["first_step_warm_s"], f["target_warm_s"], f["warm_met"]),
                         (9.5, 2.1, 3.0, True))
        self.assertEqual((f["kernels_compiled_cold"], f["kernels_compiled_warm"]), (412, 0))
        self.assertFalse(gpu_check.first_step_summary(None, bench(1, first=3.0))["warm_met"])
        self.assertIsNone(gpu_check.first_step_summary(bench(1, first=9.5), None)["warm_met"])
        self.assertIsNone(gpu_check.ratio(bench(1), bench(0)))

    def test_the_report_keeps_targets_last_and_survives_a_failing_summary(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            r = gpu_check.Report(path, summary=gpu_check.targets)
            r.set("drove_b32", bench(2))
            r.set("pytorch_b32", bench(1))
            with open(path) as f:
                written = json.load(f)
            self.assertEqual(list(written)[-1], "targets")
            self.assertEqual(written["targets"]["b32_ratio"]["ratio"], 2.0)
            self.assertNotIn("targets", r.data)
            r.summary = lambda data: 1 / 0
            r.set("x", 1)
            with open(path) as f:
                self.assertIn("ZeroDivisionError", json.load(f)["targets"]["error"])


class Stopping(unittest.TestCase):
    def test_a_command_past_its_deadline_is_stopped_with_what_it_started(self):
        # A child in a session of its own, as `drove run` starts its ranks.
        child = ("import subprocess, time; p = subprocess.Popen(['sleep', '60'], start_new_session=True); "
                 "print(p.pid, flush=True); time.sleep(60)")
        started = time.time()
        code, out, _ = gpu_check.run_bounded([sys.executable, "-c", child], None, None, timeout=1.5, grace=1)
        self.assertIsNone(code)
        self.assertLess(time.time() - started, 10)
        pid = int(out.split()[0])
        for _ in range(50):
            if not gpu_check.alive(pid):
                break
            time.sleep(0.1)
        self.assertFalse(gpu_check.alive(pid), "the rank-like grandchild is gone too")

    def test_a_command_within_its_deadline_gives_its_code_and_output(self):
        code, out, err = gpu_check.run_bounded([sys.executable, "-c", "import sys; print('{}'); sys.exit(3)"],
                                               None, None, timeout=20)
        self.assertEqual((code, out.strip()), (3, "{}"))
        self.assertEqual(gpu_check.descendants(os.getpid()), [])


if __name__ == "__main__":
    unittest.main()
