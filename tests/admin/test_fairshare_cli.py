"""`isthmus admin fairshare` renders one column per pool with usage (the API side is in
tests/admin/test_admin_api.py; here only the table the CLI prints from its answer)."""

from __future__ import annotations

from click.testing import CliRunner

from gateway.admin import cli as admin_cli

ANSWER = {"at": "2026-12-01T00:00:00Z", "half_life_s": 604800, "items": [
    {"account": "org", "parent": None, "shares": 1, "level_shares": 1, "norm_shares": 1.0,
     "raw_usage_gpu_hours": 6.0, "raw_usage_gpu_hours_per_pool": {"kube-h100": 2.0, "slurm-22": 4.0},
     "norm_usage": 1.0, "effective_usage": 1.0, "factor": 0.5},
    {"account": "team-a", "parent": "org", "shares": 1, "level_shares": 2, "norm_shares": 0.5,
     "raw_usage_gpu_hours": 4.0, "raw_usage_gpu_hours_per_pool": {"slurm-22": 4.0},
     "norm_usage": 0.66, "effective_usage": 0.66, "factor": 0.4},
]}


def test_one_column_per_pool_with_usage(monkeypatch):
    monkeypatch.setattr(admin_cli.Client, "call", lambda self, method, path, **kw: ANSWER)
    out = CliRunner().invoke(admin_cli.admin, ["fairshare", "--url", "http://127.0.0.1:1", "--token", "t"])
    assert out.exit_code == 0, out.output
    header, org, team = out.output.splitlines()[:3]
    assert header.split() == ["Account", "RawShares", "NormShares", "RawUsage(GPU-h)", "kube-h100(GPU-h)",
                              "slurm-22(GPU-h)", "EffectvUsage", "FairShare"]
    assert org.split()[3:6] == ["6.0", "2.0", "4.0"]
    assert team.split()[3:6] == ["4.0", "0.0", "4.0"]
