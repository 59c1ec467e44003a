"""The command lines that check a user's own optimizer: refopt crosscheck --impl/--rule, refopt invariants,
refopt golden export --rule; exit statuses 0 / 1 / 2 / 3; no option abbreviations."""
import json
import os
import textwrap

import pytest

from refopt.cli import main

pytest.importorskip("torch", reason="peer torch not installed")

USER_CODE = textwrap.dedent('''
    import torch

    class GoodSGD(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, dict(lr=lr))

        @torch.no_grad()
        def step(self):
            for g in self.param_groups:
                for p in g["params"]:
                    p.add_(p.grad, alpha=-g["lr"])

    class BadAdamW(torch.optim.AdamW):
        """decay applied twice as strong: a plain hyperparameter bug"""

    def make_bad(params, lr=0.01):
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.1)

    def raising(params, **kw):
        return Raises(params)

    class Raises(torch.optim.SGD):
        def __init__(self, params):
            super().__init__(params, lr=0.1)

        def step(self):
            raise RuntimeError("my optimizer is broken")
''')


@pytest.fixture()
def user_file(tmp_path):
    f = tmp_path / "my_opt.py"
    f.write_text(USER_CODE)
    return str(f)


def test_crosscheck_impl_agree_differ_usage_and_raise(user_file, capsys):
    assert main(["crosscheck", "--impl", f"{user_file}:GoodSGD", "--kwargs", '{"lr": 0.1}', "--rule", "SGD(lr=0.1)",
                 "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "AGREE" in out and "gpt" in out
    assert main(["crosscheck", "--impl", f"{user_file}:make_bad", "--rule", "AdamW(lr=0.01, weight_decay=0.1)",
                 "--steps", "5", "--problems", "stream"]) == 0
    capsys.readouterr()
    assert main(["crosscheck", "--impl", f"{user_file}:make_bad", "--rule", "Adam(lr=0.01, weight_decay=0.1)",
                 "--steps", "5", "--problems", "stream"]) == 1
    out = capsys.readouterr().out
    assert "first difference [stream]: step 1, leaf w" in out and "DIAGNOSIS: decoupled decay (lr-coupled)" in out
    assert main(["crosscheck", "--impl", f"{user_file}:raising", "--rule", "SGD(lr=0.1)", "--steps", "2"]) == 3
    assert "RuntimeError: my optimizer is broken" in capsys.readouterr().err
    for argv, msg in [
        (["--impl", f"{user_file}:Nope", "--rule", "SGD()"], "has no attribute 'Nope'"),
        (["--impl", "no_such_module_xyz:Opt", "--rule", "SGD()"], "no module named"),
        (["--impl", f"{user_file}:GoodSGD", "--rule", "SGD(lr=x)"], "unknown name 'x'"),
        (["--impl", f"{user_file}:GoodSGD", "--rule", "SGD()", "--kwargs", "{lr: 1}"], "not valid JSON"),
        (["--impl", f"{user_file}:GoodSGD", "--rule", "SGD()", "--against", "torch"], "do not apply with --impl"),
        (["--impl", f"{user_file}:GoodSGD"], "go together"),
    ]:
        assert main(["crosscheck", *argv]) == 2, argv
        assert msg in capsys.readouterr().err


def test_no_abbreviations(user_file):
    with pytest.raises(SystemExit) as e:
        main(["crosscheck", "--impl", f"{user_file}:GoodSGD", "--rul", "SGD()"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["invariants", "--impl", f"{user_file}:GoodSGD", "--rul", "SGD()"])


def test_crosscheck_impl_jax(capsys):
    pytest.importorskip("optax")
    assert main(["crosscheck", "--impl", "optax:adam", "--framework", "jax", "--kwargs", '{"learning_rate": 0.01}',
                 "--rule", "Adam(lr=0.01)", "--steps", "5", "--problems", "stream"]) == 0
    assert "AGREE" in capsys.readouterr().out


def test_invariants_cli(user_file, capsys, tmp_path, monkeypatch):
    """Only the failures' counterexamples are printed (SGD's expected gradient-scale failure is not), each
    saved in full precision with the command that replays it; the replay reproduces the failure (exit 1)."""
    monkeypatch.chdir(tmp_path)
    argv = ["invariants", "--impl", f"{user_file}:GoodSGD", "--rule", "SGD(lr=0.1)", "--max-examples", "3",
            "--properties", "gradient_scale_invariance", "orthogonal_equivariance", "purity"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "gradient_scale_invariance" in out and "expected" in out and "orthogonal_equivariance" in out
    assert "counterexample" not in out and not os.path.exists("refopt_counterexamples")
    # an Adam claimed to be SGD: orthogonal equivariance, which SGD has, fails
    argv[2], argv[4] = "torch.optim:Adam", "SGD(lr=0.1)"
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "FAILED: orthogonal_equivariance" in out
    cex = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(("gradient_scale_invariance:",
                                                                            "orthogonal_equivariance:"))]
    assert len(cex) == 1 and cex[0].startswith("orthogonal_equivariance:"), out   # not the expected one
    saved = os.path.join("refopt_counterexamples", "orthogonal_equivariance.npz")
    assert os.path.isfile(saved) and f"--replay {saved}" in out
    assert main(argv[:5] + ["--replay", saved]) == 1
    out = capsys.readouterr().out
    assert "your code:   FAILS" in out and "refopt rule: holds" in out, out
    assert main(["invariants", "--impl", f"{user_file}:GoodSGD", "--rule", "SGD()", "--properties", "nope"]) == 2


def test_golden_export_rule(tmp_path, capsys):
    d = str(tmp_path / "g")
    assert main(["golden", "export", d, "--rule", "Adam(lr=1e-3, beta2=0.95)", "--problems", "quadratic",
                 "--steps", "3"]) == 0
    stem = os.path.join(d, "adam_lr_1e-3_beta2_0.95__quadratic__float64")
    m = json.load(open(stem + ".json"))
    assert m["peers"]["torch"]["peer_call"] == "torch.optim.Adam(lr=0.001, betas=(0.9, 0.95))"
    assert m["state_fields"] == ["m", "v"]
    assert main(["golden", "check", d, "--against", "torch"]) == 0
    assert "1 pass, 0 fail" in capsys.readouterr().out
    assert main(["golden", "export", d, "--rule", "Covariant(Adam(eps=1e-6), lr=0.01)", "--name", "lamb",
                 "--problems", "stream", "--steps", "3"]) == 0
    m = json.load(open(os.path.join(d, "lamb__stream__float64.json")))
    assert m["peers"]["optax"]["constructor"] == "lamb" and m["peers"]["optax"]["kwargs"] == {"learning_rate": 0.01,
                                                                                         "weight_decay": 0.0}
    assert main(["golden", "export", d, "--rule", "Adam(", "--steps", "3"]) == 2
    assert main(["golden", "export", d, "--rule", "Adam()", "--name", "a/b"]) == 2
