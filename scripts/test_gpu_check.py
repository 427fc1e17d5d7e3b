"""Unit tests of the GPU check's choice of CUDA headers and libraries
(`gpu_check.choose_cuda`), of how it reads what drove printed (JSON lines,
step lines of a run cut short, cubecl's profiling log, the matmul sweep), of
its budget (`phase_deadline`, `fit_steps`), of the command lines it builds
(the step configurations, the same batches on both sides, the dry run that
parses them), of its summaries (`story_verdict`, `first_step_summary`, the
ratios, `targets`) and of how it stops a command past its deadline
(`run_bounded`), on fake site-packages trees laid out as the real wheels are:

  nvidia-cuda-runtime, -nvrtc, -crt, -cccl, -cublas (CUDA 13): nvidia/cu13/{include,lib}
  nvidia-cuda-runtime-cu12:                          nvidia/cuda_runtime/include
  nvidia-cuda-nvrtc-cu12:                            nvidia/cuda_nvrtc/lib/libnvrtc.so.12
  nvidia-cublas-cu12:                                nvidia/cublas/lib/libcublas.so.12
  nvidia-nccl-cu13:                                  nvidia/nccl/lib/libnccl.so.2

Standard library only:  python3 -m unittest discover -s scripts -p 'test_gpu_check.py'
With DROVE_BIN=path/to/drove the dry run also parses every command line with
that binary (a build with the GPU features and every flag the check passes).
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

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


    def test_cublas_comes_from_the_cu13_wheels_before_a_cu12_one_and_its_absence_is_a_note(self):
        old, new = self.site("a"), self.site("b")
        touch(old, "nvidia", "cublas", "lib", "libcublas.so.12")
        cu13_tree(new)
        nccl_wheel(new)
        touch(new, "nvidia", "cu13", "lib", "libcublasLt.so.13")
        cublas13 = touch(new, "nvidia", "cu13", "lib", "libcublas.so.13")
        c = gpu_check.choose_cuda([old, new])
        self.assertEqual(c["cublas"], cublas13)
        self.assertEqual((c["problems"], c["notes"]), ([], []))
        # Only cu12's: taken, and said; none: a note, not a problem.
        os.remove(cublas13)
        c = gpu_check.choose_cuda([old, new])
        self.assertTrue(c["cublas"].endswith("libcublas.so.12"))
        self.assertTrue(any("CUDA 12's" in n for n in c["notes"]), c["notes"])
        c = gpu_check.choose_cuda([new])
        self.assertIsNone(c["cublas"])
        self.assertEqual(c["problems"], [])
        self.assertTrue(any("nvidia-cublas" in n for n in c["notes"]), c["notes"])


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
        self.assertEqual(gpu_check.BUDGET_S, 290)
        self.assertLessEqual(floors, gpu_check.BUDGET_S - 60,
                             "the floors leave room for setup (about 15 s) and overruns in 290 s")
        self.assertEqual([n for n, _, _ in gpu_check.PLAN][:4],
                         ["host_floor", "pytorch", "drove_b32_all_steps", "drove_b256_all_steps"])
        # With 275 s left after setup, the first phase gets its whole cap.
        self.assertEqual(gpu_check.phase_deadline("host_floor", 275), 50)
        # The caps of the throughput phases leave room for their steps.
        self.assertGreaterEqual(gpu_check.phase_deadline("pytorch", 1000), 60)

    def test_every_planned_phase_has_its_command(self):
        cmds = gpu_check.planned_commands("D", "P", "S", "data", "model", "work", "kc")
        for name, _, _ in gpu_check.PLAN:
            self.assertIn(name, cmds, f"the phase {name} has a deadline but no command")

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
        self.assertEqual(gpu_check.fit_steps(300, 10, 256, 80, {**slow, "sentences_per_s": 40}, minimum=30)[0], 30)
        self.assertEqual(gpu_check.fit_steps(40, 5, 256, 40, {**slow, "sentences_per_s": 40})[0], 20)
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

    def test_the_story_runs_four_ranks_of_32_for_12_steps_with_the_gradient_path_at_auto(self):
        args = gpu_check.story_args("naive", "D", "M", "O", ["--random-init"])
        flag = lambda name: args[args.index(name) + 1]
        self.assertEqual(args[:2], ["train", "ner"])
        self.assertEqual((flag("--device"), flag("--seeding")), ("cuda:0", "naive"))
        # As the README launches it: no --gradient-path (auto); one may be asked for.
        self.assertNotIn("--gradient-path", args)
        host = gpu_check.story_args("naive", "D", "M", "O", gradient_path="host")
        self.assertEqual(host[host.index("--gradient-path") + 1], "host")
        self.assertEqual((flag("--max-steps"), flag("--batch-size"), flag("--max-train-sentences")),
                         ("12", "32", str(4 * 32 * 12)))
        self.assertEqual((flag("--augment-mask"), flag("--diagnose-every"), flag("--eval")), ("0.15", "5", ""))
        self.assertIn("--json", args)
        self.assertEqual(args[-1], "--random-init")


def bench(sps, peak=None, first=None, median=None, **more):
    run = {"sentences_per_s": sps, "median_sentences_per_s": sps if median is None else median,
           "first_step_seconds": first, **more}
    if peak is not None:
        run["gpu_memory_sampled"] = {"peak_used_mib": peak + 500, "idle_used_mib": 500, "peak_over_idle_mib": peak}
    return run


def torch_run(sps, median=None, reserved_mib=None, context_mib=500, batch=32, tf32=False):
    run = {"implementation": "pytorch", "batch_size": batch, "tf32": tf32, "sentences_per_s": sps,
           "median_sentences_per_s": sps if median is None else median}
    if reserved_mib is not None:
        run.update({"gpu_max_memory_reserved_bytes": reserved_mib * 2**20, "cuda_context_bytes": context_mib * 2**20})
    return run


class Summaries(unittest.TestCase):
    def test_ratios_of_means_and_of_medians_and_the_mean_near_its_median(self):
        ours, theirs = bench(400, median=500), bench(1000, median=1250)
        self.assertAlmostEqual(gpu_check.ratio(ours, theirs), 0.4)
        self.assertAlmostEqual(gpu_check.median_ratio(ours, theirs), 0.4)
        # Mean step over median step: 500 / 400 sentences/s = 1.25: 25% off.
        self.assertAlmostEqual(gpu_check.mean_over_median(ours), 1.25)
        self.assertFalse(gpu_check.mean_near_median(ours))
        self.assertTrue(gpu_check.mean_near_median(bench(1000, median=1049)))
        self.assertTrue(gpu_check.mean_near_median(bench(1000, median=951)))
        self.assertFalse(gpu_check.mean_near_median(bench(1000, median=1051)))
        for missing in (None, "not run", bench(0)):
            self.assertIsNone(gpu_check.mean_near_median(missing))
            self.assertIsNone(gpu_check.ratio(missing, theirs))
            self.assertIsNone(gpu_check.median_ratio(theirs, missing))
        # A run without its median has a mean ratio only.
        self.assertIsNone(gpu_check.mean_near_median({"sentences_per_s": 1.0}))
        self.assertIsNone(gpu_check.median_ratio({"sentences_per_s": 1.0}, theirs))

    def test_targets_from_every_phase(self):
        data = {"drove_b32_all_steps": bench(800, median=820, peak=1800,
                                             transfers_per_step={"max_reads": 1, "max_uploads": 4, "reads": 1.0,
                                                                 "uploads": 4.0}),
                "pytorch_b32_f32": torch_run(1900, reserved_mib=1400),
                "pytorch_b32_tf32": torch_run(2000, batch=32, tf32=True),
                "drove_b256_all_steps": bench(5000, median=6000, peak=9000),
                "pytorch_b256_f32": torch_run(10000, reserved_mib=8000, batch=256),
                "drove_b32_baseline": bench(350, median=440),
                "launches": bench(700, first=1.5, kernels_launched_per_step=600.0,
                                  transfers_per_step={"max_reads": 1, "max_uploads": 6, "reads": 1.0, "uploads": 6.0}),
                "host_floor": bench(40, median=50, step_mean_seconds=0.025)}
        t = gpu_check.targets(data)
        b32 = t["b32_all_steps_over_pytorch_f32"]
        self.assertAlmostEqual(b32["ratio_mean"], 800 / 1900)
        self.assertAlmostEqual(b32["ratio_median"], 820 / 1900)
        self.assertTrue(b32["met"], "0.42 >= 0.4")
        b256 = t["b256_all_steps_over_pytorch_f32"]
        self.assertAlmostEqual(b256["ratio_mean"], 0.5)
        self.assertFalse(b256["met"], "0.5 < 0.6")
        self.assertEqual(b256["goal"], 1.0)
        near = t["mean_within_5pct_of_median"]
        self.assertTrue(near["drove_b32_all_steps"]["met"])
        self.assertFalse(near["drove_b256_all_steps"]["met"])
        self.assertFalse(near["drove_b32_baseline"]["met"])
        self.assertFalse(near["met"], "decided on the runs with every step on")
        self.assertEqual(t["peak_memory"]["b32"]["drove_mib"], 1800)
        self.assertEqual(t["peak_memory"]["b32"]["pytorch_mib"], 1900, "context 500 + reserved 1400")
        self.assertAlmostEqual(t["peak_memory"]["b256"]["drove_over_pytorch"], 9000 / 8500)
        c = t["comparisons"]
        self.assertEqual(set(c), {f"b{b}_{k}" for b in (32, 256) for k in ("all_steps", "baseline", "steps_2_5")})
        self.assertAlmostEqual(c["b32_all_steps"]["vs_pytorch_tf32"]["ratio_mean"], 0.4)
        self.assertAlmostEqual(c["b32_baseline"]["vs_pytorch_f32"]["ratio_mean"], 350 / 1900)
        self.assertIsNone(c["b256_steps_2_5"]["vs_pytorch_f32"]["ratio_mean"])
        self.assertIn("--dense", c["b32_steps_2_5"]["flags"])
        self.assertTrue(t["transfers"]["met"])
        self.assertEqual(t["transfers"]["kernels_launched_per_step"], 600.0)
        self.assertEqual(t["transfers"]["drove_b32_all_steps"]["max_uploads"], 4)
        self.assertAlmostEqual(t["host_floor"]["step_median_seconds"], 1 / 50)
        self.assertEqual((t["warm_first_step"]["seconds"], t["warm_first_step"]["met"]), (1.5, True))
        self.assertFalse(t["all_met"])
        json.dumps(t)
        # Both ratios met and both means near their medians: all met.
        data["drove_b256_all_steps"] = bench(6500, median=6600, peak=9000)
        self.assertTrue(gpu_check.targets(data)["all_met"])

    def test_targets_not_measured_are_null_not_false(self):
        t = gpu_check.targets({"drove_b32_all_steps": None, "pytorch_b32_f32": torch_run(1800),
                               "drove_b256_all_steps": "not run"})
        self.assertIsNone(t["b32_all_steps_over_pytorch_f32"]["ratio_mean"])
        self.assertIsNone(t["b32_all_steps_over_pytorch_f32"]["met"])
        self.assertIsNone(t["b256_all_steps_over_pytorch_f32"]["met"])
        self.assertIsNone(t["mean_within_5pct_of_median"]["met"])
        self.assertIsNone(t["warm_first_step"]["met"])
        self.assertIsNone(t["transfers"]["met"])
        self.assertIsNone(t["peak_memory"]["b32"]["drove_over_pytorch"])
        self.assertIsNone(t["all_met"])
        # Too many reads a step is not met.
        t = gpu_check.targets({"launches": bench(1, transfers_per_step={"max_reads": 2, "max_uploads": 3})})
        self.assertFalse(t["transfers"]["met"])

    def test_a_run_cut_short_is_compared_and_said_to_be_partial(self):
        partial = {**bench(600, median=610), "partial": True, "steps_timed": 12}
        c = gpu_check.comparison(partial, torch_run(1200))
        self.assertAlmostEqual(c["ratio_mean"], 0.5)
        self.assertTrue(c["drove_partial"])
        self.assertEqual(c["drove_steps_timed"], 12)

    def test_the_first_step_cold_and_warm_side_by_side(self):
        f = gpu_check.first_step_summary(bench(1, first=9.5, kernels_compiled=412, kernel_cache="/w/kcache"),
                                         bench(1, first=2.1, kernels_compiled=0))
        self.assertEqual((f["first_step_cold_s"], f["first_step_warm_s"], f["target_warm_s"], f["warm_met"]),
                         (9.5, 2.1, 3.0, True))
        self.assertEqual((f["kernels_compiled_cold"], f["kernels_compiled_warm"]), (412, 0))
        self.assertFalse(gpu_check.first_step_summary(None, bench(1, first=3.0))["warm_met"])
        self.assertIsNone(gpu_check.first_step_summary(bench(1, first=9.5), None)["warm_met"])

    def test_the_report_keeps_targets_last_and_survives_a_failing_summary(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            r = gpu_check.Report(path, summary=gpu_check.targets)
            r.set("drove_b32_all_steps", bench(2))
            r.set("pytorch_b32_f32", torch_run(1))
            with open(path) as f:
                written = json.load(f)
            self.assertEqual(list(written)[-1], "targets")
            self.assertEqual(written["targets"]["b32_all_steps_over_pytorch_f32"]["ratio_mean"], 2.0)
            self.assertNotIn("targets", r.data)
            r.summary = lambda data: 1 / 0
            r.set("x", 1)
            with open(path) as f:
                self.assertIn("ZeroDivisionError", json.load(f)["targets"]["error"])


def flag_value(cmd, name):
    return cmd[cmd.index(name) + 1]


class Commands(unittest.TestCase):
    def test_the_baseline_is_the_behaviour_before_the_issue_and_all_steps_turns_each_on(self):
        base = gpu_check.step_flags("baseline")
        self.assertEqual(base, ["--dropout-masks", "host", "--loss-read", "after-forward", "--dense", "plain",
                                "--embedding-grad", "select", "--matmul", "burn", "--prewarm", "off"])
        on = dict(zip(*[iter(gpu_check.step_flags("all_steps"))] * 2))
        self.assertEqual(on, {"--dropout-masks": "device", "--loss-read": "at-update", "--dense": "split-k",
                              "--embedding-grad": "sliced", "--matmul": "drove", "--prewarm": "on"})
        # Steps 2 and 5 alone: the baseline's flags but those two.
        alone = dict(zip(*[iter(gpu_check.step_flags("steps_2_5"))] * 2))
        differ = {f for f, v in alone.items() if v != dict(zip(*[iter(base)] * 2))[f]}
        self.assertEqual(differ, {"--dense", "--embedding-grad"})
        self.assertEqual((alone["--dense"], alone["--embedding-grad"]), ("split-k", "sliced"))
        # Every configuration names every switch once, in the same order.
        for config in gpu_check.CONFIG_ORDER:
            flags = gpu_check.step_flags(config)[::2]
            self.assertEqual(flags, base[::2])
        self.assertEqual(gpu_check.CONFIG_ORDER[0], "all_steps", "the targets' runs first")

    def test_a_switch_can_be_overridden_but_not_invented(self):
        flags = gpu_check.step_flags("all_steps", prewarm="off")
        self.assertEqual(flag_value(flags, "--prewarm"), "off")
        self.assertEqual(flag_value(flags, "--dense"), "split-k")
        with self.assertRaises(KeyError):
            gpu_check.step_flags("all_steps", prewram="off")

    def test_drove_and_pytorch_run_the_same_batches(self):
        cmds = gpu_check.planned_commands("D", "P", "S", "data", "model", "work", "kc", ["--random-init"])
        torch_cmd = cmds["pytorch"]
        self.assertEqual(torch_cmd[:2], ["P", "S"])
        self.assertEqual(flag_value(torch_cmd, "--batch-size"), "32,256")
        self.assertEqual(flag_value(torch_cmd, "--tf32"), "both")
        self.assertIn("--fused-adamw", torch_cmd)
        for batch in (32, 256):
            for config in gpu_check.CONFIG_ORDER:
                cmd = cmds[f"drove_b{batch}_{config}"]
                self.assertEqual(cmd[:6], ["D", "bench", "train", "--device", "cuda", "--json"])
                self.assertEqual(flag_value(cmd, "--batch-size"), str(batch))
                for flag in ("--steps", "--warmup-steps", "--bucket-window", "--data", "--model"):
                    self.assertEqual(flag_value(cmd, flag), flag_value(torch_cmd, flag), flag)
                self.assertEqual(flag_value(cmd, "--kernel-cache"), "kc")
                self.assertEqual(cmd[-1], "--random-init")
                self.assertEqual(cmd[cmd.index("--dropout-masks"):cmd.index("--dropout-masks") + 12],
                                 gpu_check.step_flags(config))
        self.assertEqual(torch_cmd[-1], "--random-init")

    def test_the_short_runs_and_the_rest(self):
        cmds = gpu_check.planned_commands("D", "P", "S", "data", "model", "work", "kc")
        host = cmds["host_floor"]
        self.assertEqual((flag_value(host, "--batch-size"), flag_value(host, "--prewarm")), ("1", "on"))
        launches = cmds["launches"]
        self.assertIn("--count-launches", launches)
        self.assertEqual((flag_value(launches, "--batch-size"), flag_value(launches, "--prewarm"),
                          flag_value(launches, "--dense")), ("32", "off", "split-k"))
        profile = cmds["profile_b256"]
        self.assertNotIn("--count-launches", profile)
        self.assertEqual((flag_value(profile, "--batch-size"), flag_value(profile, "--prewarm"),
                          flag_value(profile, "--matmul")), ("256", "off", "drove"))
        self.assertEqual(cmds["matmul"][:6], ["D", "bench", "matmul", "--device", "cuda", "--json"])
        one, four = cmds["equivalence_world1"], cmds["equivalence_world4"]
        self.assertEqual(four[:5], ["D", "run", "--np", "4", "--"])
        for cmd in (one, four):
            self.assertEqual((flag_value(cmd, "--matmul"), flag_value(cmd, "--matmul-precision"),
                              flag_value(cmd, "--gradient-path")), ("drove", "f32", "host"))
        self.assertEqual((flag_value(one, "--batch-size"), flag_value(four, "--batch-size")), ("16", "4"))
        story = cmds["story_derived"]
        self.assertEqual(story[:6], ["D", "run", "--np", "4", "--", "D"])
        self.assertNotIn("--gradient-path", story)
        self.assertEqual(flag_value(story, "--device"), "cuda:0")

    def test_each_command_is_parsed_by_the_local_tools(self):
        checks = gpu_check.parse_check(["D", "bench", "train", "--steps", "4"], "D", "/bin/drove", "P", "S", "/s.py")
        self.assertEqual(checks, [["/bin/drove", "bench", "train", "--steps", "4", "--help"]])
        checks = gpu_check.parse_check(["D", "run", "--np", "4", "--", "D", "train", "ner", "--json"], "D",
                                       "/bin/drove", "P", "S", "/s.py")
        self.assertEqual(checks, [["/bin/drove", "run", "--np", "4", "--help"],
                                  ["/bin/drove", "train", "ner", "--json", "--help"]])
        checks = gpu_check.parse_check(["P", "S", "--tf32", "both"], "D", "/bin/drove", "P", "S", "/s.py")
        self.assertEqual(checks, [[sys.executable, "/s.py", "--tf32", "both", "--check-args"]])
        self.assertIsNone(gpu_check.parse_check(["nvidia-smi"], "D", "/bin/drove", "P", "S", "/s.py"))


HERE = os.path.dirname(os.path.abspath(__file__))
PYTORCH_NER = os.path.join(HERE, "..", "bench", "pytorch_ner.py")


def fake_drove(folder, body):
    """An executable Python script standing in for drove."""
    path = os.path.join(folder, "drove")
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    os.chmod(path, 0o755)
    return path


@mock.patch.object(gpu_check, "log", lambda msg: None)
class DryRun(unittest.TestCase):
    def test_pytorch_ner_checks_its_arguments_without_torch(self):
        out = subprocess.run([sys.executable, PYTORCH_NER, "--device", "cuda", "--fused-adamw", "--batch-size",
                              "32,256", "--tf32", "both", "--steps", "3", "--check-args"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        runs = json.loads(out.stdout)["runs"]
        # TF32 off at every batch size first (the targets' runs), then on.
        self.assertEqual(runs, [{"batch_size": 32, "tf32": False}, {"batch_size": 256, "tf32": False},
                                {"batch_size": 32, "tf32": True}, {"batch_size": 256, "tf32": True}])
        for bad in (["--batch-size", "32,x"], ["--tf32", "maybe"], ["--tf32", "both"], ["--fused-adamw"]):
            out = subprocess.run([sys.executable, PYTORCH_NER] + bad + ["--check-args"], capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(out.returncode, 2, bad)

    def test_a_flag_the_binary_does_not_know_fails_the_dry_run(self):
        with tempfile.TemporaryDirectory() as d:
            # Knows every flag but --prewarm, as a binary from before the pre-warm would.
            drove = fake_drove(d, "sys.exit(2 if '--prewarm' in sys.argv else 0)")
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                failures = gpu_check.dry_run(drove, PYTORCH_NER)
            # Each configuration's run at each batch, the host floor, launches and profile; for both inits.
            self.assertEqual(failures, 2 * (3 * 2 + 3), printed.getvalue())
            self.assertIn("drove_b32_baseline: FAILED", printed.getvalue())
            self.assertIn("pytorch: ok", printed.getvalue())
            drove = fake_drove(d, "sys.exit(0)")
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                self.assertEqual(gpu_check.dry_run(drove, PYTORCH_NER), 0, printed.getvalue())

    @unittest.skipUnless(os.environ.get("DROVE_BIN"), "set DROVE_BIN to a drove binary to parse with it")
    def test_every_command_parses_with_the_real_binary(self):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            failures = gpu_check.dry_run(os.environ["DROVE_BIN"], PYTORCH_NER)
        self.assertEqual(failures, 0, printed.getvalue())


# Lines as cubecl 0.10 writes them at `basic` (lavapipe, 2026-12-07), a
# first launch that compiled, and the summary table it may print.
PROFILE_LOG = """\
| 8.630727ms | PrngKernel | NormalFamily | WgpuRuntime
| 917.9µs    | FullKernel | WgpuRuntime
| 108.22µs   | FullKernel | WgpuRuntime
| 110.0µs    | FullKernel | WgpuRuntime
| 1.5s       | MatmulEntry | WgpuRuntime
| 2ms        | MatmulEntry | WgpuRuntime
| 2ms        | MatmulEntry | WgpuRuntime
| 400ns      | Tiny | WgpuRuntime
|⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺| 
| Name                        | Duration   | Num Computed | Ratio |
| FullKernel | WgpuRuntime    | 1.13ms     | 3            | 10 %  |
"""


@mock.patch.object(gpu_check, "log", lambda msg: None)
class Profile(unittest.TestCase):
    def test_durations_as_rust_prints_them(self):
        for text, seconds in (("8.630727ms", 8.630727e-3), ("501.083µs", 501.083e-6), ("1.5s", 1.5),
                              ("400ns", 4e-7), ("2us", 2e-6), (" 917.9µs   ", 917.9e-6)):
            self.assertAlmostEqual(gpu_check.parse_duration(text), seconds, places=12)
        for bad in ("Name", "Duration", "1.13 ms", "", "ms", "FullKernel"):
            self.assertIsNone(gpu_check.parse_duration(bad))

    def test_the_log_ranked_by_count_times_median(self):
        r = gpu_check.profile_ranking(PROFILE_LOG, steps=2, top=3)
        self.assertEqual((r["kernels_launched"], r["distinct_kernels"]), (8, 4))
        self.assertEqual([x["kernel"] for x in r["top"]],
                         ["PrngKernel | NormalFamily | WgpuRuntime", "MatmulEntry | WgpuRuntime",
                          "FullKernel | WgpuRuntime"])
        matmul = r["top"][1]
        # The 1.5 s first launch (its compile) is in the total, not in the ranking.
        self.assertEqual(matmul["count"], 3)
        self.assertAlmostEqual(matmul["total_ms"], 1504.0)
        self.assertAlmostEqual(matmul["ranked_ms"], 6.0)
        self.assertAlmostEqual(matmul["per_step_ms"], 3.0)
        self.assertAlmostEqual(r["top"][2]["median_us"], 110.0)
        self.assertAlmostEqual(sum(x["share"] for x in r["top"]) + 0.0004 / r["ranked_ms"], 1.0)
        self.assertAlmostEqual(r["ranked_ms_per_step"], r["ranked_ms"] / 2)
        json.dumps(r)
        empty = gpu_check.profile_ranking("", steps=0)
        self.assertEqual((empty["kernels_launched"], empty["top"], empty["ranked_ms_per_step"]), (0, [], None))

    def test_the_config_is_the_toml_cubecl_reads(self):
        import tomllib
        path = '/tmp/a "quoted" dir/profile.log'
        config = tomllib.loads(gpu_check.profile_config(path))
        self.assertEqual(config, {"profiling": {"logger": {"level": "basic", "file": path, "append": False}}})

    def test_the_profile_phase_reads_the_log_the_run_wrote_from_its_folder(self):
        # A drove that does what cubecl does: reads cubecl.toml from its working folder.
        body = ("import tomllib\nc = tomllib.load(open('cubecl.toml', 'rb'))['profiling']['logger']\n"
                f"open(c['file'], 'w').write({PROFILE_LOG!r})\n"
                "print(json.dumps({'sentences_per_s': 10.0, 'median_sentences_per_s': 10.0}))")
        with tempfile.TemporaryDirectory() as d:
            drove = fake_drove(d, body)
            report = gpu_check.Report(os.path.join(d, "r.json"))
            ranking = gpu_check.profile_phase(report, "profile", [drove], dict(os.environ), 30,
                                              os.path.join(d, "prof"), os.path.join(d, "profile.log.xz"), 2, 256, 1)
            self.assertEqual(ranking["kernels_launched"], 8)
            self.assertEqual(report.data["profile"]["sentences_per_s"], 10.0)
            self.assertEqual(report.data["profile_ranking"]["top"][0]["count"], 1)
            import lzma
            with lzma.open(os.path.join(d, "profile.log.xz"), "rt") as f:
                self.assertEqual(f.read(), PROFILE_LOG)
            # A run that wrote no log is an error, not a crash.
            report = gpu_check.Report(os.path.join(d, "r2.json"))
            gpu_check.profile_phase(report, "profile", [fake_drove(d, "print('{}')")], dict(os.environ), 30,
                                    os.path.join(d, "prof2"), os.path.join(d, "p2.log.xz"), 2, 256, 1)
            self.assertIsNone(report.data["profile_ranking"])
            self.assertIn("no profiling log", report.data["errors"][-1]["error"])


STEP_LINES = """\
training on cuda:0 (burn-cubecl on CUDA)
2026-12-07T12:44:11.862754Z DEBUG drove_bench::train: step step=1 seconds=2.5 sentences_per_s=12.8
2026-12-07T12:44:12.305004Z DEBUG drove_bench::train: step step=2 seconds=0.1 sentences_per_s=320.0
2026-12-07T12:44:12.721253Z DEBUG drove_bench::train: step step=3 seconds=0.1 sentences_per_s=320.0
2026-12-07T12:44:12.821253Z DEBUG drove_bench::train: step step=4 seconds=0.3 sentences_per_s=106.66666666666667
"""


@mock.patch.object(gpu_check, "log", lambda msg: None)
class CutShort(unittest.TestCase):
    def test_a_bench_cut_at_its_deadline_keeps_the_steps_it_logged(self):
        r = gpu_check.steps_from_log(STEP_LINES, warmup=1, batch=32)
        self.assertTrue(r["partial"])
        self.assertEqual((r["steps_logged"], r["steps_timed"], r["first_step_seconds"]), (4, 3, 2.5))
        # 96 sentences in 0.5 s; the median step 0.1 s (320 sentences/s).
        self.assertAlmostEqual(r["sentences_per_s"], 96 / 0.5)
        self.assertAlmostEqual(r["median_sentences_per_s"], 320.0)
        self.assertAlmostEqual(r["step_median_seconds"], 0.1)
        self.assertIsNone(gpu_check.steps_from_log(STEP_LINES, warmup=4, batch=32))
        self.assertIsNone(gpu_check.steps_from_log("", warmup=0, batch=32))

    def test_a_bench_that_printed_no_json_is_recorded_from_its_steps(self):
        body = f"sys.stderr.write({STEP_LINES!r})\nsys.exit(1)"
        with tempfile.TemporaryDirectory() as d:
            report = gpu_check.Report(os.path.join(d, "r.json"))
            value = gpu_check.measured(report, "drove_b32_all_steps", [fake_drove(d, body)], dict(os.environ), 30,
                                       32, 1)
            self.assertTrue(value["partial"])
            self.assertEqual((value["steps_timed"], value["exit_code"]), (3, 1))
            self.assertIn("exit 1", report.data["errors"][0]["error"])
            # One that printed its JSON is recorded as printed.
            ok = fake_drove(d, "print(json.dumps({'sentences_per_s': 5.0}))")
            value = gpu_check.measured(report, "x", [ok], dict(os.environ), 30, 32, 1)
            self.assertEqual((value["sentences_per_s"], value["exit_code"]), (5.0, 0))
            self.assertNotIn("partial", value)

    def test_pytorch_s_runs_are_recorded_by_batch_and_precision(self):
        runs = [torch_run(100, batch=32), torch_run(900, batch=256), torch_run(120, batch=32, tf32=True)]
        body = "".join(f"print(json.dumps({r!r}))\n" for r in runs) + "sys.stderr.write('cut')\nsys.exit(1)"
        with tempfile.TemporaryDirectory() as d:
            report = gpu_check.Report(os.path.join(d, "r.json"))
            got = gpu_check.run_pytorch(report, [fake_drove(d, body)], dict(os.environ), 30)
            self.assertEqual(len(got), 3)
            self.assertEqual(report.data["pytorch_b256_f32"]["sentences_per_s"], 900)
            self.assertEqual(report.data["pytorch_b32_tf32"]["sentences_per_s"], 120)
            self.assertNotIn("pytorch_b256_tf32", report.data)
            self.assertEqual(report.data["pytorch_process"]["runs"], 3)
        self.assertEqual(gpu_check.json_objects('{"a": 1}\nnoise\n{"b": 2}\n{bad\n'), [{"a": 1}, {"b": 2}])


class Matmul(unittest.TestCase):
    def test_each_shape_s_best_kernel_beside_cublas(self):
        def row(strategy, us, precision="tf32", matched=True, error=None, cls="ffn_up/weight_grad"):
            return {"class": cls, "sentences": 256, "seq": 128, "strategy": strategy, "precision": precision,
                    "mean_us": us, "tflops": 1.0, "matched": matched, "error": error}
        report = {"rows": [row("simple_cyclic_cmma", 300.0), row("double_cyclic_cmma", 200.0),
                           row("ordered_double_cmma", 150.0, matched=False), row("simple_unit", 900.0, "f32"),
                           row("specialized_tma_cmma", None, error="no TMA"),
                           row("cublas_sgemm", 450.0, "f32"), row("cublas_tf32", 100.0),
                           row("simple_unit", 50.0, "f32", cls="attention/scores")],
                  "skipped": 60, "cublas": {"available": True, "reason": None}}
        s = gpu_check.matmul_summary(report)
        self.assertEqual(s["shapes_skipped"], 60)
        wgrad = next(x for x in s["shapes"] if x["class"] == "ffn_up/weight_grad")
        # A kernel whose product did not match its reference is not the best.
        self.assertEqual(wgrad["best"]["strategy"], "double_cyclic_cmma")
        self.assertAlmostEqual(wgrad["best_over_cublas_tf32"], 2.0)
        self.assertEqual(wgrad["best_f32"]["strategy"], "simple_unit")
        self.assertAlmostEqual(wgrad["best_f32_over_cublas_sgemm"], 2.0)
        self.assertEqual(wgrad["failed"], ["specialized_tma_cmma"])
        scores = next(x for x in s["shapes"] if x["class"] == "attention/scores")
        self.assertIsNone(scores["best_over_cublas_tf32"])
        self.assertIsNone(gpu_check.matmul_summary(None))


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
