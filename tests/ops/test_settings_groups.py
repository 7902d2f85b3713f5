"""Settings in groups (docs/operations.md, "Settings"): every flat setting belongs to exactly
one group, with the same type, and a group is a frozen view of the flat values it was built
from, so the environment variables and flat attributes stay as they were."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.kit.settings import GROUPS, DispatchSettings, Settings


def test_each_setting_is_in_exactly_one_group_with_its_type():
    owners: dict[str, list[str]] = {}
    for group, model in GROUPS.items():
        for name, field in model.model_fields.items():
            if name in model.DERIVED:
                continue
            assert name in Settings.model_fields, f"{group}.{name} is not a setting"
            assert field.annotation == Settings.model_fields[name].annotation, f"{group}.{name}"
            owners.setdefault(name, []).append(group)
    assert {n: g for n, g in owners.items() if len(g) > 1} == {}
    assert sorted(set(Settings.model_fields) - owners.keys()) == []


def test_groups_are_frozen_views_of_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ISTHMUS_DISPATCH_BATCH", "7")
    monkeypatch.setenv("ISTHMUS_WEBHOOK_INTERVAL_S", "2.5")
    monkeypatch.setenv("ISTHMUS_MAX_CONNECTIONS", "40")
    monkeypatch.setenv("ISTHMUS_DATABASE_URL", "postgresql+psycopg://u@h/db")
    settings = Settings()
    assert settings.dispatch_batch == settings.dispatch.dispatch_batch == 7  # flat and grouped alike
    assert settings.webhooks.webhook_interval_s == 2.5
    assert settings.server.stream_budget == 30  # derived: three quarters of max_connections
    assert settings.dispatch.is_sqlite is settings.webhooks.is_sqlite is False
    assert isinstance(settings.dispatch, DispatchSettings)
    with pytest.raises(ValidationError):
        settings.dispatch.dispatch_batch = 8  # read-only: change the flat settings and build again
    assert "metrics_token" not in repr(settings.model_copy(update={"metrics_token": "s3cret"}).metrics)
