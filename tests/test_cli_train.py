"""`refopt train` end to end at a tiny size: the loss falls, every file is written and parseable, the
same seed gives the same files, and user mistakes get a one-line error."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from refopt.cli import main

TINY = ["--model", "mlp", "--steps", "60", "--batch-size", "32", "--hidden", "32", "--no-progress", "--eval-interval", "20"]


def _read_metrics(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_mlp_train_writes_files_and_learns(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--optimizer", "adam", "--lr", "1e-2", *TINY]) == 0
    rows = _read_metrics(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 61))
    first = np.mean([float(r["loss"]) for r in rows[:5]])
    last = np.mean([float(r["loss"]) for r in rows[-5:]])
    assert last < 0.5 * first, (first, last)
    assert float(rows[0]["lr[all]"]) == 1e-2
    assert rows[19]["val_acc"] != "" and rows[18]["val_acc"] == ""
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rule"]["name"] == "Adam" and cfg["rule"]["lr"] == 1e-2
    assert cfg["settings"]["seed"] == 0 and cfg["steps"] == 60
    assert len(cfg["task"]["data_sha256"]) == 64
    assert cfg["final"]["test_acc"] > 0.8
    assert "numpy" in cfg["versions"]
    assert cfg["matrix_products"].split(" ")[0] in ("mkl", "numpy")   # which BLAS multiplied (refopt.fast.blas)
    png = (out / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    printed = capsys.readouterr().out
    assert "test_acc=" in printed


def test_same_seed_same_files(tmp_path):
    for name in ("a", "b"):
        assert main(["train", "--out", str(tmp_path / name), "--optimizer", "sgd", "--seed", "3", *TINY]) == 0
    for f in ("metrics.csv", "config.json", "loss.png"):
        a = (tmp_path / "a" / f).read_bytes()
        b = (tmp_path / "b" / f).read_bytes()
        if f == "config.json":  # the out directory is a setting and differs by construction
            a, b = (json.loads(x) for x in (a, b))
            a["settings"].pop("out"), b["settings"].pop("out")
        assert a == b, f
    assert main(["train", "--out", str(tmp_path / "c"), "--optimizer", "sgd", "--seed", "4", *TINY]) == 0
    assert (tmp_path / "c" / "metrics.csv").read_bytes() != (tmp_path / "a" / "metrics.csv").read_bytes()


def test_float64_run(tmp_path):
    assert main(["train", "--model", "mlp", "--out", str(tmp_path), "--dtype", "float64", "--steps", "3",
                 "--no-progress"]) == 0
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["settings"]["dtype"] == "float64"


@pytest.mark.parametrize("argv, needle", [
    (["--lr", "-1"], "error: --lr must be >= 0, got -1.0"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--beta1", "1.5", "--optimizer", "adam"], "error: --beta1 must be in [0, 1), got 1.5"),
    # the rule's error names the option that set the field, not the field
    (["--optimizer", "muon", "--lr", "-1"], "error: --lr must be >= 0, got -1.0"),
    (["--optimizer", "muon", "--adam-lr", "-1"], "error: --adam-lr must be >= 0, got -1.0"),
    (["--optimizer", "muon", "--muon-momentum", "1.5"], "error: --muon-momentum must be in [0, 1), got 1.5"),
    (["--optimizer", "muon", "--ns-steps", "0"], "error: --ns-steps must be an int in [1, 100), got 0"),
    (["--optimizer", "covariant", "--covariant-base", "sgd", "--momentum", "-1"], "error: --momentum must be in"),
    (["--optimizer", "schedulefree-adamw", "--sf-beta", "2"], "error: --sf-beta must be in [0, 1], got 2.0"),
    (["--optimizer", "ema", "--ema-decay", "2"], "error: --ema-decay must be in [0, 1), got 2.0"),
    (["--optimizer", "adamh", "--eps", "nan"], "error: --eps must be"),
    (["--optimizer", "sgd", "--nesterov", "--momentum", "0"], "error: --nesterov: nesterov=True needs momentum > 0"),
    (["--weight-decay", "2", "--wd-mode", "independent"], "error: --weight-decay: independent weight_decay is"),
    (["--model", "gpt", "--n-head", "3"], "error: --n-embd 128 is not divisible by --n-head 3"),
])
def test_bad_values_one_line_error(tmp_path, capsys, argv, needle):
    assert main(["train", "--model", "mlp", "--out", str(tmp_path), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


def test_out_is_a_file_or_unwritable(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["train", "--model", "mlp", "--out", str(f), "--steps", "1", "--no-progress"]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--out", str(f / "sub"), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot create --out directory" in err and "\n" not in err


def test_unknown_choice_is_rejected_by_the_console_script():
    r = subprocess.run([sys.executable, "-m", "refopt.cli", "train", "--optimizer", "no_such_rule"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'no_such_rule'" in r.stderr


@pytest.mark.parametrize("optimizer", ["muon", "schedulefree-adamw", "ema"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, optimizer):
    args = ["--optimizer", optimizer, *TINY]
    assert main(["train", "--out", str(tmp_path / "full"), *args]) == 0
    assert main(["train", "--out", str(tmp_path / "cut"), "--stop-after", "25", *args]) == 0
    cut = _read_metrics(tmp_path / "cut" / "metrics.csv")
    assert len(cut) == 25
    assert main(["train", "--resume", str(tmp_path / "cut"), "--no-progress"]) == 0
    for f in ("metrics.csv", "loss.png"):
        assert (tmp_path / "cut" / f).read_bytes() == (tmp_path / "full" / f).read_bytes(), f
    a = json.loads((tmp_path / "cut" / "config.json").read_text())
    b = json.loads((tmp_path / "full" / "config.json").read_text())
    assert a["final"] == b["final"] and a["rule"] == b["rule"]


def test_resume_errors(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 2
    assert "missing config.json" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "done"), *TINY]) == 0
    assert main(["train", "--resume", str(tmp_path / "done"), "--no-progress"]) == 2
    assert "already completed" in capsys.readouterr().err


def test_compare_writes_summary_and_plot(tmp_path):
    from refopt.cli import main as cli

    assert cli(["compare", "--model", "mlp", "--optimizers", "sgd,adamw", "--steps", "40", "--hidden", "16",
                "--eval-interval", "20", "--no-progress", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["optimizer"] for r in rows] == ["sgd", "adamw"]
    for r in rows:
        assert float(r["test_acc"]) > 0.5 and float(r["seconds"]) > 0
    # the same init and data order: the first batch loss is identical for both optimizers
    m = [_read_metrics(tmp_path / f"metrics_{n}.csv") for n in ("sgd", "adamw")]
    assert m[0][0]["loss"] == m[1][0]["loss"] and m[0][1]["loss"] != m[1][1]["loss"]
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_rejects_unknown_names(tmp_path, capsys):
    from refopt.cli import main as cli

    assert cli(["compare", "--optimizers", "adamw,nope", "--out", str(tmp_path)]) == 2
    assert "unknown ['nope']" in capsys.readouterr().err


GPT_TINY = ["--model", "gpt", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "16",
            "--batch-size", "8", "--eval-interval", "15", "--eval-batches", "2", "--sample-chars", "40",
            "--no-progress"]


def test_gpt_train_tiny_learns_and_writes_a_sample(tmp_path, capsys):
    out = tmp_path / "gpt"
    assert main(["train", "--out", str(out), "--steps", "60", "--optimizer", "adamw", "--lr", "1e-2", *GPT_TINY]) == 0
    rows = _read_metrics(out / "metrics.csv")
    first = np.mean([float(r["loss"]) for r in rows[:5]])
    last = np.mean([float(r["loss"]) for r in rows[-5:]])
    assert first > 4.0 and last < first - 1.0, (first, last)  # ln(V ~ 100) = 4.6 at init
    assert rows[14]["val_loss"] != "" and float(rows[-1]["val_loss"]) < float(rows[14]["val_loss"])
    cfg = json.loads((out / "config.json").read_text())
    task = cfg["task"]
    assert task["data"] == "pydoc_data.topics" and len(task["data_sha256"]) == 64
    assert task["python_version"] == sys.version.split()[0]
    assert task["config"]["n_embd"] == 32 and task["config"]["tie_head"] is True
    sample = (out / "sample.txt").read_text(encoding="utf-8")
    assert len(sample.rstrip("\n")) == 41  # the one-character prompt and 40 new characters
    assert "sample" in capsys.readouterr().out


def test_gpt_default_optimizer_is_muon_on_hidden_matrices(tmp_path):
    out = tmp_path / "gpt"
    assert main(["train", "--out", str(out), "--steps", "3", *GPT_TINY]) == 0
    rule = json.loads((out / "config.json").read_text())["rule"]
    assert rule["name"] == "Partition"
    assert rule["rules"]["hidden"]["name"] == "Muon" and rule["rules"]["other"]["name"] == "AdamW"


def test_gpt_data_file_errors(tmp_path, capsys):
    bad = tmp_path / "bin.txt"
    bad.write_bytes(b"\x00\x01\x02" * 1000)
    for path, needle in ((tmp_path / "missing.txt", "not found"), (bad, "binary")):
        assert main(["train", "--data", str(path), "--out", str(tmp_path / "o"), "--steps", "1", *GPT_TINY]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err
    short = tmp_path / "short.txt"
    short.write_text("abc")
    assert main(["train", "--data", str(short), "--out", str(tmp_path / "o"), "--steps", "1", *GPT_TINY]) == 2
    assert "too short" in capsys.readouterr().err


def test_checkpoint_bytes_are_reproducible(tmp_path):
    for name in ("a", "b"):
        assert main(["train", "--out", str(tmp_path / name), "--optimizer", "adamw", *TINY]) == 0
    a, b = ((tmp_path / n / "checkpoint.npz").read_bytes() for n in ("a", "b"))
    assert a == b


def test_schedule_free_warmup_is_logged_in_the_lr_column(tmp_path):
    assert main(["train", "--out", str(tmp_path), "--optimizer", "schedulefree-sgd", "--lr", "0.5",
                 "--warmup", "4", *TINY]) == 0
    lrs = [float(r["lr[all]"]) for r in _read_metrics(tmp_path / "metrics.csv")[:6]]
    assert lrs == [0.125, 0.25, 0.375, 0.5, 0.5, 0.5]
    rule = json.loads((tmp_path / "config.json").read_text())["rule"]
    assert rule["warmup_steps"] == 4 and rule["schedule"] is None


def test_a_second_run_into_the_same_out_is_refused_unless_overwrite(tmp_path, capsys):
    """refopt train / compare never replace a previous run silently: a directory holding their outputs is
    refused (exit 2, one line) unless --overwrite, which also removes the previous compare's per-rule files
    (no stale metrics_NAME.csv next to the new summary). Negative control: --resume into its own directory
    and a directory holding only other files are fine."""
    tiny = ["--model", "mlp", "--steps", "4", "--batch-size", "16", "--hidden", "8", "--no-progress",
            "--eval-interval", "2"]
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--stop-after", "2", *tiny]) == 0
    before = (out / "metrics.csv").read_text()
    capsys.readouterr()
    assert main(["train", "--out", str(out), *tiny]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err and "\n" not in err.strip()
    assert (out / "metrics.csv").read_text() == before
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0          # its own run: continued
    assert main(["train", "--out", str(out), "--overwrite", *tiny]) == 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["train", "--out", str(other), *tiny]) == 0 and (other / "notes.txt").read_text() == "mine"
    cmp = tmp_path / "cmp"
    assert main(["compare", "--out", str(cmp), "--optimizers", "sgd,adam", *tiny]) == 0
    (cmp / "metrics_survey.csv").write_text("mine")                     # a user's file, not a rule's
    before = {p.name: p.read_bytes() for p in cmp.iterdir()}
    assert main(["compare", "--out", str(cmp), "--optimizers", "adamw", *tiny]) == 2
    assert main(["compare", "--out", str(cmp), "--optimizers", "adamw,sgd", "--lr", "-1", "--overwrite", *tiny]) == 2
    assert {p.name: p.read_bytes() for p in cmp.iterdir()} == before    # a refused command removed nothing
    assert main(["compare", "--out", str(out), "--optimizers", "adamw", *tiny]) == 2   # a train run's directory
    assert main(["compare", "--out", str(cmp), "--optimizers", "adamw", "--overwrite", *tiny]) == 0
    assert sorted(p.name for p in cmp.glob("metrics_*.csv")) == ["metrics_adamw.csv", "metrics_survey.csv"]
    done = tmp_path / "done"
    assert main(["train", "--out", str(done), *tiny]) == 0
    kept = (other / "metrics.csv").read_bytes()
    assert main(["train", "--resume", str(done), "--out", str(other), "--overwrite", "--no-progress"]) == 2
    assert (other / "metrics.csv").read_bytes() == kept                 # "already completed": nothing removed


# ---- refopt compare: each option applies to the rules that use it, everything checked before training ----
CMP_TINY = ["--model", "mlp", "--steps", "3", "--batch-size", "16", "--hidden", "8", "--no-progress",
            "--eval-interval", "3"]


def _config(path):
    with open(path / "config.json") as f:
        return json.load(f)


def test_compare_applies_schedule_only_to_the_rules_that_take_it(tmp_path):
    """docs/compare.md's combination: --schedule wsd (and --decay-fraction) with a Schedule-Free rule in the list. The
    schedule reaches adamw and muon (their lr decays at the last step, their config records it) but not
    schedulefree-adamw (constant lr, no schedule in its rule or settings)."""
    out = tmp_path / "cmp"
    assert main(["compare", "--optimizers", "adamw,muon,schedulefree-adamw", "--schedule", "wsd",
                 "--decay-fraction", "0.5", "--out", str(out), *CMP_TINY]) == 0
    runs = _config(out)["runs"]
    assert list(runs) == ["adamw", "muon", "schedulefree-adamw"]
    for name, col in (("adamw", "lr[all]"), ("muon", "lr[hidden]")):
        assert runs[name]["settings"]["schedule"] == "wsd" and runs[name]["settings"]["decay_fraction"] == 0.5
        rule = runs[name]["rule"]
        sched = (rule["rules"]["hidden"] if name == "muon" else rule)["schedule"]
        assert sched["name"] == "WSD" and sched["total_steps"] == 3 and sched["decay_steps"] == 2
        lrs = [float(r[col]) for r in _read_metrics(out / f"metrics_{name}.csv")]
        assert lrs[0] == runs[name]["lr"] and lrs[2] < lrs[1] < lrs[0], lrs
    sf = runs["schedulefree-adamw"]
    assert "schedule" not in sf["settings"] and "decay_fraction" not in sf["settings"]
    assert sf["rule"]["schedule"] is None
    assert {float(r["lr[all]"]) for r in _read_metrics(out / "metrics_schedulefree-adamw.csv")} == {sf["lr"]}


def test_compare_runs_are_the_train_runs_of_their_own_options(tmp_path):
    """--momentum 0.5 with sgd,adamw: each compare run is bit for bit the `refopt train` run of its optimizer
    with the options it uses (sgd with --momentum 0.5, adamw without it). Negative control: sgd at the
    default momentum 0.9 gives other losses, so the comparison sees whether --momentum was applied."""
    out = tmp_path / "cmp"
    assert main(["compare", "--optimizers", "sgd,adamw", "--momentum", "0.5", "--out", str(out), *CMP_TINY]) == 0
    runs = _config(out)["runs"]
    assert runs["sgd"]["settings"]["momentum"] == 0.5 and runs["sgd"]["rule"]["momentum"] == 0.5
    assert "momentum" not in runs["adamw"]["settings"] and "nesterov" not in runs["adamw"]["settings"]
    for name, extra in (("sgd", ["--momentum", "0.5"]), ("adamw", []), ("sgd", [])):
        d = tmp_path / f"train_{name}_{len(extra)}"
        assert main(["train", "--optimizer", name, *extra, "--out", str(d), *CMP_TINY]) == 0
        same = (d / "metrics.csv").read_text() == (out / f"metrics_{name}.csv").read_text()
        assert same == (name != "sgd" or bool(extra)), name
    assert runs["adamw"]["rule"] == _config(tmp_path / "train_adamw_0")["rule"]


@pytest.mark.parametrize("options, needle", [
    (["--optimizers", "adamw,sgd", "--muon-scale", "jordan"], "--muon-scale does not apply to any of --optimizers"),
    (["--optimizers", "schedulefree-adamw,schedulefree-sgd", "--schedule", "wsd"], "--schedule does not apply"),
    (["--optimizers", "adamw,muon", "--muon-momentum", "1.5"], "--muon-momentum must be in [0, 1)"),
    (["--optimizers", "schedulefree-adamw,adamw", "--schedule", "wsd", "--decay-fraction", "2"],
     "--decay-fraction must be in [0, 1], got 2.0"),
    (["--optimizers", "sgd,ema", "--ema-decay", "-1"], "--ema-decay must be in [0, 1), got -1.0"),
])
def test_compare_refuses_a_bad_option_before_training_anything(tmp_path, capsys, monkeypatch, options, needle):
    """An option for none of the listed rules, or a bad value only the last rule uses, exits 2 with one line
    before any run trains (fit never called) and before --out is created (not after training the first
    rules). Negative control (run by hand): building each rule only when its turn comes trains
    the first rule before the last one's bad value is seen, and the fit check fails."""
    from refopt.cli import train

    fitted = []
    monkeypatch.setattr(train, "fit", lambda *a, **k: fitted.append(a) or (_ for _ in ()).throw(AssertionError))
    out = tmp_path / "cmp"
    assert main(["compare", *options, "--out", str(out), *CMP_TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err
    assert fitted == [] and not out.exists()


def test_train_alone_also_refuses_an_option_its_optimizer_does_not_use(tmp_path, capsys):
    for argv, needle in ((["--optimizer", "schedulefree-adamw", "--schedule", "wsd"], "--schedule does not apply"),
                         (["--optimizer", "adamw", "--momentum", "0.5"], "--momentum does not apply")):
        assert main(["train", *argv, "--out", str(tmp_path / "t"), *CMP_TINY]) == 2
        assert needle in capsys.readouterr().err
        assert not (tmp_path / "t" / "metrics.csv").exists()


def test_for_optimizer_drops_what_the_rule_does_not_use_and_leaves_args_alone():
    from refopt.cli import build_parser, explicit_options, optimizers

    argv = ["compare", "--optimizers", "adamw,schedulefree-adamw", "--schedule", "wsd", "--decay-fraction", "0.5",
            "--momentum", "0.5", "--warmup", "2"]
    args = build_parser().parse_args(argv)
    args.explicit_options = explicit_options(argv)
    before = (vars(args).copy(), set(args.explicit_options))
    sf = optimizers.for_optimizer(args, "schedulefree-adamw")
    assert (sf.schedule, sf.decay_fraction, sf.momentum, sf.warmup) == (None, 0.2, 0.9, 2)
    assert sf.explicit_options == {"warmup", "optimizers"}
    adamw = optimizers.for_optimizer(args, "adamw")
    assert (adamw.schedule, adamw.decay_fraction, adamw.momentum) == ("wsd", 0.5, 0.9)
    assert adamw.explicit_options == {"schedule", "decay_fraction", "warmup", "optimizers"}
    assert (vars(args), args.explicit_options) == before


def test_a_rule_error_names_the_option_that_set_the_field():
    """optimizers._make: the field the message names first becomes its option; a message about no field it
    was given passes unchanged (negative control: 'lr' inside another word is not the field lr)."""
    from refopt.cli.optimizers import _make

    class Rule:
        def __init__(self, lr=0.1, momentum=0.9, msg=""):
            raise ValueError(msg)

    cases = [("lr must be >= 0, got -1.0", {}, "--lr must be >= 0, got -1.0"),
             ("lr must be >= 0, got -1.0", {"lr": "--adam-lr"}, "--adam-lr must be >= 0, got -1.0"),
             ("momentum: bad", {}, "--momentum: bad"),
             ("with these settings momentum and lr clash", {}, "--momentum: with these settings momentum and lr clash"),
             ("scalrs are not arrays", {}, "scalrs are not arrays")]
    for msg, options, expected in cases:
        with pytest.raises(ValueError) as e:
            _make(Rule, options, lr=1.0, momentum=0.5, msg=msg)
        assert str(e.value) == expected
