"""The command line never surprises: one-line errors with exit status 2 for user mistakes
(bad run directories, options that do not apply), exit status 1 and one line for anything unexpected
(--debug shows the traceback), a help text for every option, the lr of every parameter group in
metrics.csv, and plots that can be read."""
from __future__ import annotations

import csv
import json
import shutil
from argparse import Namespace

import numpy as np
import pytest

import refopt
from refopt.cli import build_parser, explicit_options, main, output, train
from refopt.cli import compare as cmp

TINY = ["--model", "mlp", "--steps", "6", "--batch-size", "32", "--hidden", "16", "--no-progress",
        "--eval-interval", "3"]


def _one_line_error(capsys, needle):
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "cut"
    assert main(["train", "--out", str(d), "--optimizer", "muon", "--stop-after", "3", *TINY]) == 0
    return d


def _copy(run_dir, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(run_dir, d)
    return d


# ---- unexpected errors: one line, exit 1; --debug shows the traceback ---------------------------------
def test_unexpected_exception_is_one_line_exit_1(monkeypatch, capsys, tmp_path):
    def boom(args):
        raise KeyError("deep inside")

    monkeypatch.setattr(train, "run", boom)
    assert main(["train", "--out", str(tmp_path)]) == 1
    err = _one_line_error(capsys, "KeyError")
    assert "--debug" in err
    for argv in (["--debug", "train"], ["train", "--debug"]):
        with pytest.raises(KeyError, match="deep inside"):
            main([*argv, "--out", str(tmp_path)])


# ---- --resume with a bad run directory: one line, exit 2 ----------------------------------------------
@pytest.mark.parametrize("config, needle", [
    ("{}", "no 'settings'"),
    ("[1, 2]", "no 'settings'"),
    ("not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    ("DROP:steps", "lacks the settings ['steps']"),
    ("DROP:model", "lacks the settings ['model']"),
    ("SET:model=cnn", "invalid value 'cnn' for model"),
    ("SET:hidden=16", "invalid value 16 for hidden"),
    ("SET:lr=fast", "invalid value 'fast' for lr"),
    ("SET:qk_norm=1", "invalid value 1 for qk_norm"),
    ("SET:bogus=1", "unknown settings ['bogus']"),
])
def test_resume_with_a_bad_config_json(run_dir, tmp_path, capsys, config, needle):
    d = _copy(run_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    if isinstance(config, bytes):
        (d / "config.json").write_bytes(config)
    elif config.startswith("DROP:"):
        del cfg["settings"][config[5:]]
        (d / "config.json").write_text(json.dumps(cfg))
    elif config.startswith("SET:"):
        k, v = config[4:].split("=")
        cfg["settings"][k] = json.loads(v) if v[0].isdigit() else v
        (d / "config.json").write_text(json.dumps(cfg))
    else:
        (d / "config.json").write_text(config)
    assert main(["train", "--resume", str(d)]) == 2
    _one_line_error(capsys, needle)


def test_resume_with_bad_checkpoint_or_metrics(run_dir, tmp_path, capsys):
    d = _copy(run_dir, tmp_path)
    data = bytearray((d / "checkpoint.npz").read_bytes())
    data[data.rindex(b"\x93NUMPY") + 200] ^= 0xFF          # inside the last array's data
    (d / "checkpoint.npz").write_bytes(bytes(data))
    assert main(["train", "--resume", str(d)]) == 2
    _one_line_error(capsys, "checkpoint")
    d = _copy(run_dir, tmp_path / "m")
    (d / "metrics.csv").write_text("nothing,here\n1,2\n")
    assert main(["train", "--resume", str(d)]) == 2
    _one_line_error(capsys, "metrics.csv is malformed")


def test_resume_refuses_options_it_would_ignore(run_dir, tmp_path, capsys):
    d = _copy(run_dir, tmp_path)
    assert main(["train", "--resume", str(d), "--lr", "0.5"]) == 2
    _one_line_error(capsys, "not --lr")
    assert main(["train", "--resume", str(d), "--no-progress", "--stop-after", "1"]) == 0


# ---- options that do not apply ------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--model", "mlp", "--n-layer", "3"], "--n-layer applies to --model gpt, not --model mlp"),
    (["--model", "gpt", "--hidden", "32"], "--hidden applies to --model mlp"),
    (["--model", "mlp", "--optimizer", "adamw", "--muon-scale", "spectral"], "--muon-scale does not apply"),
    (["--model", "mlp", "--optimizer", "adam", "--adam-lr", "0.1"], "--adam-lr does not apply"),
    (["--model", "mlp", "--optimizer", "sgd", "--beta1", "0.8"], "--beta1 does not apply"),
    (["--model", "mlp", "--optimizer", "adamw", "--momentum", "0.5"], "--momentum does not apply"),
    (["--model", "mlp", "--optimizer", "covariant", "--momentum", "0.5"], "--momentum does not apply"),
    (["--model", "mlp", "--optimizer", "adamw", "--decay-fraction", "0.5"], "--decay-fraction does not apply"),
    (["--model", "mlp", "--optimizer", "schedulefree-sgd", "--eps", "1e-6"], "--eps does not apply"),
    (["--model", "mlp", "--optimizer", "ema", "--sf-beta", "0.5"], "--sf-beta does not apply"),
])
def test_train_rejects_options_that_do_not_apply(tmp_path, capsys, argv, needle):
    assert main(["train", "--out", str(tmp_path), "--steps", "1", "--no-progress", *argv]) == 2
    _one_line_error(capsys, needle)
    assert not (tmp_path / "config.json").exists()


def _args(argv):
    args = build_parser().parse_args(argv)
    args.explicit_options = explicit_options(argv)
    return args


@pytest.mark.parametrize("argv, ok", [
    (["train", "--optimizer", "covariant", "--covariant-base", "sgd", "--momentum", "0.5"], True),
    (["train", "--optimizer", "covariant", "--covariant-base", "muon", "--ns-steps", "3"], True),
    (["train", "--optimizer", "muonh", "--muon-scale", "jordan", "--beta1", "0.8"], True),
    (["train", "--optimizer", "normuon", "--muon-momentum", "0.9", "--ns-steps", "4", "--adam-lr", "1e-3"], True),
    (["train", "--optimizer", "dion", "--muon-momentum", "0.9"], True),
    (["train", "--optimizer", "dion", "--ns-steps", "4"], False),        # Dion has no Newton-Schulz
    (["train", "--optimizer", "adamw", "--schedule", "wsd", "--decay-fraction", "0.3"], True),
    (["train", "--optimizer", "adamw", "--momentum", "0.9"], False),     # the default value, written: still refused
    (["train", "--optimizer", "schedulefree-adamw", "--schedule", "cosine"], False),
])
def test_which_options_apply(argv, ok):
    args = _args(argv)
    if ok:
        train.check_options(args, [args.optimizer])
    else:
        with pytest.raises(ValueError, match="does not apply"):
            train.check_options(args, [args.optimizer])


def test_compare_rejects_an_option_that_applies_to_none_of_its_optimizers(tmp_path, capsys):
    assert main(["compare", "--model", "mlp", "--optimizers", "adamw,sgd", "--muon-scale", "jordan",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    _one_line_error(capsys, "--muon-scale does not apply to any of --optimizers adamw,sgd")
    args = _args(["compare", "--optimizers", "adamw,muon", "--muon-scale", "jordan"])
    train.check_options(args, ["adamw", "muon"])            # applies to one of them: accepted
    args = _args(["compare", "--optimizers", "adamw,schedulefree-adamw", "--schedule", "wsd"])
    train.check_options(args, ["adamw", "schedulefree-adamw"])
    assert main(["compare", "--model", "mlp", "--optimizers", "sgd", "--n-head", "2", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "--n-head applies to --model gpt")


def test_explicit_options_sees_what_was_written():
    assert explicit_options(["train", "--lr", "0.1", "--no-progress"]) == {"lr", "no_progress"}
    assert explicit_options(["compare", "--out", "x"]) == {"out"}
    assert explicit_options(["train"]) == set()


# ---- help texts -------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["train", "compare"])
def test_every_option_has_a_help_text(command, capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    missing = [a.option_strings[0] for a in sub._actions if a.option_strings and not (a.help or "").strip()]
    assert missing == []
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "default: gpt 32, mlp 64)" in text and "(default: 0.9)" in text


def test_golden_export_help_lists_the_case_names(capsys):
    from refopt.golden import catalog

    with pytest.raises(SystemExit):
        build_parser().parse_args(["golden", "export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for case in catalog():
        assert case.name in text


# ---- the CLI and the API label the MLP the same way --------------------------------------------------
def test_cli_labels_the_mlp_as_the_api_does():
    from refopt.cli.tasks import MLPTask

    for hidden in ([128], [32, 16]):
        task = MLPTask(Namespace(batch_size=64, hidden=hidden), np.float32)
        params = task.init_params(0)
        assert task.labels(params) == refopt.mlp_labels(params)


# ---- metrics.csv: the lr of every parameter group ----------------------------------------------------
def test_metrics_has_the_lr_of_every_group(tmp_path):
    out = tmp_path / "muon"
    assert main(["train", "--out", str(out), "--optimizer", "muon", "--lr", "0.05", "--adam-lr", "0.004",
                 "--schedule", "cosine", "--warmup", "2", *TINY]) == 0
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:4] == ["step", "loss", "lr[hidden]", "lr[other]"]
    sched = refopt.schedules.warmup_cosine(2, 6, floor=0.0)
    for r in rows:
        g = float(sched(int(r["step"])))
        assert float(r["lr[hidden]"]) == 0.05 * g and float(r["lr[other]"]) == 0.004 * g
    assert float(rows[0]["lr[hidden]"]) != float(rows[0]["lr[other]"])
    ema = refopt.EMA(refopt.AdamW(lr=0.01, schedule=lambda t: 0.5), decay=0.9)
    info = {}
    refopt.update(ema, refopt.init(ema, np.ones(2)), np.ones(2), np.ones(2), info=info)
    assert train.group_lrs(info["lr"]) == {"lr[all]": 0.005}


# ---- plots ----------------------------------------------------------------------------------------------
def _rows(n=40, lo=2.1, hi=2.6, groups=("hidden", "other")):
    rows = []
    for k in range(1, n + 1):
        r = {"step": k, "loss": hi - (hi - lo) * k / n, **{f"lr[{g}]": 0.01 * (i + 1) for i, g in enumerate(groups)}}
        if k % 10 == 0:
            r["val_loss"] = r["loss"] + 0.01
        r["_seconds"] = 3.0 + 0.1 * k
        rows.append(r)
    return rows


def _labelled_ticks(ax):
    lo, hi = ax.get_ylim()
    return [t for t, lab in zip(ax.get_yticks(), ax.get_yticklabels()) if lo <= t <= hi and lab.get_text()]


def test_loss_png_is_readable():
    import matplotlib.pyplot as plt

    rule = refopt.Partition(rules={"hidden": refopt.Muon(lr=0.02), "other": refopt.AdamW(lr=3e-3)},
                            labels=refopt.gpt_labels)
    fig = train.loss_figure(_rows(), f"gpt: {train.rule_title(rule)}", "test")
    ax, ax_lr = fig.axes
    assert "Muon" in ax.get_title() and "AdamW" in ax.get_title()
    assert ax.get_yscale() == "log" and len(_labelled_ticks(ax)) >= 4      # a range of less than a decade
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("test loss") for t in legend) and not any("validation" in t for t in legend)
    assert sorted(t.get_text() for t in ax_lr.get_legend().get_texts()) == ["lr[hidden]", "lr[other]"]
    plt.close(fig)
    assert train.rule_title(refopt.EMA(refopt.AdamW(lr=1e-3), decay=0.9)) == "EMA(AdamW)"


@pytest.mark.parametrize("lo, hi", [(2.1, 2.6), (0.05, 3.0), (1e-4, 10.0), (0.9, 0.9)])
def test_log_ticks(lo, hi):
    ticks = output.log_ticks(lo, hi)
    assert len(ticks) >= 4 and ticks == sorted(ticks) and len({f"{t:.3g}" for t in ticks}) == len(ticks)
    assert all(lo / 1.06 <= t <= hi * 1.06 for t in ticks)
    ratios = np.diff(np.log(ticks))
    assert ratios.max() <= 3 * np.log(hi / lo) / len(ticks) + 0.2


def test_compare_png_legend_outside_and_time_is_step_times_the_median():
    """The legend is below the panels (off the data); the time panel's x is (step - 1) x the rule's median
    time per step from the alternating timing rounds (not the run's own wall clock: the second run's 40 s
    offset in _seconds does not move it), and the legend gives that median and the rounds' range."""
    import matplotlib.pyplot as plt

    timing = {"adamw": {"median": 100.0, "min": 90.0, "max": 130.0}, "muon": {"median": 250.0, "min": 240.0, "max": 260.0}}
    runs = {"adamw": {"rows": _rows()}, "muon": {"rows": [{**r, "_seconds": r["_seconds"] + 40} for r in _rows()]}}
    for name, run in runs.items():
        run.update(timing=timing[name], load=(1.5, 1.75))
    fig = cmp.compare_figure(runs, Namespace(model="mlp", seed=0))
    fig.canvas.draw()
    legend_box = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert not legend_box.overlaps(ax.get_window_extent())
    wall = fig.axes[1]
    spans = {line.get_label(): (line.get_xdata()[0], line.get_xdata()[-1]) for line in wall.get_lines()
             if "train" in line.get_label()}
    assert spans == {"adamw train (smoothed)": (0.0, 39 * 0.1), "muon train (smoothed)": (0.0, 39 * 0.25)}
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "adamw test (100 ms/step, 90-130)" in labels and "muon test (250 ms/step, 240-260)" in labels
    assert "load average 1.5 before, 1.8 after" in wall.get_title() and "not to be trusted" not in wall.get_title()
    plt.close(fig)
    runs["muon"]["timing"] = {"median": 250.0, "min": 150.0, "max": 400.0}     # rounds 2.7x apart
    fig = cmp.compare_figure(runs, Namespace(model="mlp", seed=0))
    assert "not to be trusted: a rule's rounds differ up to 2.7x (a busy machine)" in fig.axes[1].get_title()
    plt.close(fig)


def test_time_steps_alternates_rounds_and_takes_medians(monkeypatch):
    """compare's time per step: every rule timed once per round, the order rotated from round to round;
    per round the median step, over the rounds the median (and the extremes). The step times here are
    made up (fit replaced) so that the medians are known."""
    from refopt.cli import train

    order, durations = [], {"a": iter([[5, 1, 1, 1, 9], [2, 2, 2, 2, 2], [3, 3, 3, 3, 30]]),
                            "b": iter([[10, 10, 10, 10, 10], [40, 40, 40, 40, 40], [20, 20, 20, 20, 20]])}

    def fake_fit(task, rule, total, seed, lr, schedule, eval_interval, progress, stop_after):
        order.append(task)
        assert stop_after == 5 and eval_interval > total and not progress
        ends = np.cumsum(next(durations[task])) / 1000
        return None, None, [{"_seconds": float(e)} for e in ends]

    monkeypatch.setattr(train, "fit", fake_fit)
    args = Namespace(seed=0, schedule_fn=None)
    got = cmp.time_steps({"a": args, "b": args}, {"a": ("a", None, 0.1, 100), "b": ("b", None, 0.1, 100)})
    assert order == ["a", "b", "b", "a", "a", "b"]
    for name, expect in (("a", {"median": 2.0, "min": 1.0, "max": 3.0}), ("b", {"median": 20.0, "min": 10.0, "max": 40.0})):
        assert got["ms"][name] == pytest.approx(expect, rel=1e-9), name
    assert len(got["load"]) == 2


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_every_optimizer_builds_its_rule(model):
    """Every --optimizer name (and every --covariant-base) gives a rule: a helper of the options table
    once shadowed a builder's helper and broke muonh, adamh and covariant."""
    from refopt.cli import optimizers

    for name in optimizers.OPTIMIZERS:
        for base in (["adam", "muon", "sgd"] if name == "covariant" else ["adam"]):
            args = _args(["train", "--model", model, "--optimizer", name, "--covariant-base", base]
                         if name == "covariant" else ["train", "--model", model, "--optimizer", name])
            train._resolve(args)
            args.warmup = 10
            args.schedule_fn = optimizers.build_schedule(args, 100)
            labels = {"w": "hidden", "b": "other"}
            rule, lr = optimizers.build_rule(args, model, args.schedule_fn, labels)
            assert isinstance(rule, refopt.core.Rule) and lr > 0
            params = {"w": np.ones((3, 2)), "b": np.ones(2)}
            refopt.update(rule, refopt.init(rule, params), params, params)
