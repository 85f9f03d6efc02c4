"""The trustfl command: list, run, report, and one-line errors."""
import json
from pathlib import Path

from trustfl.cli import main


def test_list_shows_every_kind(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for fragment in ("dataset: ", "digits", "partitioner: ", "dirichlet", "model: ", "cnn_cafcor", "algorithm: ",
                     "fedavg", "aggregator: ", "mean"):
        assert fragment in out


def test_run_then_report(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "cli"\nrounds = 2\n[data]\nnum_clients = 4\n[model]\nname = "logreg"\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet", "--set", "client.lr=0.2"]) == 0
    out = capsys.readouterr().out
    assert "final accuracy:" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] == 2
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_rounds_whose_every_message_is_rejected_are_said(tmp_path, capsys):
    # lr = 1e30 diverges at once: every client's message is non-finite and rejected, the model never moves
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "div"\nrounds = 3\n[data]\nnum_clients = 4\n[model]\nname = "mlp"\nhidden = [16]\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "bad"), "--set", "client.lr=1e30"]) == 0
    err = capsys.readouterr().err
    assert err.count("rejected all 4 messages") == 1 and "[div] warning: round 1 " in err  # said once, when it starts
    assert "warning: every message was rejected in 3 of 3 rounds" in err
    rows = [json.loads(line) for line in (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rejected"] for r in rows] == [4, 4, 4]
    assert json.loads((tmp_path / "bad" / "summary.json").read_text())["rounds_all_rejected"] == 3
    assert main(["run", str(cfg), "--out", str(tmp_path / "good"), "--quiet", "--set", "client.lr=0.2"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert json.loads((tmp_path / "good" / "summary.json").read_text())["rounds_all_rejected"] == 0


def test_lattice_decode_failures_are_said_once(tmp_path, capsys):
    # 4 bits at step 1e-3 decode within ±0.008 of the key: most coordinates of a trained model's message fail, and
    # the run said nothing (accuracy below chance, the count only in metrics.jsonl)
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "lat"\nrounds = 2\n[data]\nnum_clients = 4\n[model]\nname = "logreg"\n[client]\nlr = 0.5\n'
                   '[compress]\nuplink = { name = "lattice", bits = 4, step = 1e-3 }\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["decode_failures"] > 0
    assert err.count("decoded wrong") == 1
    assert f"[lat] warning: round 1: {rows[0]['decode_failures']} coordinates fell outside the lattice" in err
    assert main(["run", str(cfg), "--out", str(tmp_path / "q"), "--set", "compress.uplink.bits=16",
                 "--set", "compress.uplink.step=1e-4"]) == 0
    assert "decoded wrong" not in capsys.readouterr().err


def test_rounds_left_with_too_few_messages_for_the_rule_are_skipped_and_said(tmp_path, capsys):
    # 4 NaN senders of 6 leave 2 messages, under cwtm's 3 for f = 1: each round is skipped, the run goes on
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "few"\nrounds = 2\n[data]\nnum_clients = 6\n[model]\nname = "logreg"\n[cohort]\n'
                   'sampler = "all"\n[aggregator]\nname = "cwtm"\nf = 1\n[attack]\nname = "nan"\nnum_byzantine = 4\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert err.count("was skipped") == 1 and "[few] warning: round 1 was skipped" in err  # said once, when it starts
    assert "2 of 6 messages passed screening" in err and "warning: 2 of 2 rounds were skipped" in err
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["rounds_skipped"] == 2
    assert main(["report", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert " skipped" in out.splitlines()[0] and "rounds_skipped=2" in out


def test_rounds_whose_server_step_would_overflow_the_model_keep_it_and_are_said(tmp_path, capsys):
    # server.lr = 1e300: finite messages, a finite mean, and θ + 1e300·Δ beyond float32. The model was saved as
    # inf and NaN with exit code 0 and a warning that blamed the clients' messages; now the step is not taken.
    import torch
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "srv"\nrounds = 2\n[data]\nnum_clients = 4\n[model]\nname = "logreg"\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--set", "server.lr=1e300"]) == 0
    err = capsys.readouterr().err
    assert err.count("server step would have made the model non-finite") == 1  # said once, when it starts
    assert "warning: in 2 of 2 rounds the server's step would have made the model non-finite" in err
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["rejected"], r["diverged"]) for r in rows] == [(0, 1), (0, 1)]
    model = torch.load(tmp_path / "r" / "model.pt")
    assert all(bool(torch.isfinite(v).all()) for v in model.values())
    assert main(["run", str(cfg), "--out", str(tmp_path / "ok"), "--quiet", "--set", "server.lr=1.0"]) == 0
    after = torch.load(tmp_path / "ok" / "model.pt")  # the same run steps where the step is finite
    ok_rows = (tmp_path / "ok" / "metrics.jsonl").read_text().splitlines()
    assert not any("diverged" in json.loads(line) for line in ok_rows)
    assert not all(torch.equal(model[k], after[k]) for k in model)
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert " diverged" in out.splitlines()[0] and "rounds_diverged=2" in out


def test_a_run_whose_final_metric_is_nan_is_summed_up_without_a_traceback(tmp_path, capsys):
    # columns c, c, -c under weights 3e38: inf - inf where |c| > 1.13, so every metric is NaN, which the summary
    # line failed to format (a traceback after the run)
    import numpy as np
    import torch
    c = np.random.default_rng(0).normal(size=40)
    np.savez(tmp_path / "reg.npz", x=np.stack([c, c, -c], axis=1), y=c)
    torch.save(torch.tensor([3e38, 3e38, 3e38, 0.0]), tmp_path / "init.pt")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'rounds = 1\n[data]\nnum_clients = 2\ndataset = "npz"\npath = "{tmp_path / "reg.npz"}"\n'
                   f'[model]\nname = "logreg"\ninit_from = "{tmp_path / "init.pt"}"\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    assert "final mse: nan (best nan) after 1 rounds" in capsys.readouterr().out


def test_a_model_file_beyond_the_models_dtype_or_complex_is_refused(tmp_path, capsys):
    # float64 1e39 passed the finiteness check and became inf in the float32 model; complex NaN passed it too
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'rounds = 1\n[data]\nnum_clients = 2\n[model]\nname = "logreg"\n'
                   f'init_from = "{tmp_path / "init.pt"}"\n')
    import torch
    from trustfl.config.build import build_federation
    from trustfl.config.load import load_config
    shape = build_federation(load_config(cfg, ['model.init_from=""']), quiet=True).initial_params.shape
    for values, fragment in ((torch.full(shape, 1e39, dtype=torch.float64), "beyond the model's torch.float32 range"),
                             (torch.full(shape, complex(1, 1)), "holds complex values")):
        torch.save(values, tmp_path / "init.pt")
        assert main(["validate", str(cfg)]) == 2
        assert fragment in capsys.readouterr().err


def test_config_error_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[client]\nlr = -3\n")
    assert main(["run", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "`client.lr`" in err


def test_import_flag_registers_parts_like_plugins(tmp_path, capsys, monkeypatch):
    (tmp_path / "myagg.py").write_text(
        "import trustfl\nfrom trustfl.aggregate.base import Mean\n"
        "trustfl.register('aggregator', 'my_mean_from_flag')(type('MyMean', (Mean,), {}))\n")
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml"
    args = ["validate", str(config), "--set", 'aggregator={name="my_mean_from_flag"}']
    assert main(args) == 2                                   # unknown without the module
    assert "my_mean_from_flag" in capsys.readouterr().err
    assert main(args + ["--import", "myagg.py"]) == 0
    assert "valid" in capsys.readouterr().out


def test_metrics_rows_that_are_not_trustfl_rows_are_one_line(tmp_path, capsys):
    for body, fragment in (('[1, 2, 3]\n', "a row must be a JSON object, found list"),
                           ('{"accuracy": 0.5}\n', "`round` must be an integer >= 0, found None"),
                           ('{"round": "x"}\n', "`round` must be an integer >= 0, found 'x'"),
                           ('{"round": 1}\n{"round": 1e400}\n', "line 2: `round` must be an integer >= 0, found inf")):
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / "metrics.jsonl").write_text(body)
        for command in (["report", str(run)], ["compare", str(run), "--no-plots", "--out", str(tmp_path)]):
            assert main(command) == 2  # compare crashed with AttributeError on a JSON array
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and "is not a trustfl metrics file" in err and fragment in err, err
