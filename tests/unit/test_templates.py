"""A job set's template (gateway/domain/templates.py): what each task is rendered to."""

from __future__ import annotations

from gateway.domain.templates import (
    RENDERED,
    Template,
    format_value,
    render_task,
    unknown_names,
)

SPEC = {"image": "busybox", "command": ["train", "--lr={{ lr }}", "--seed={{index}}"],
        "env": {"RUN": "r{{ index }}-{{ lr }}"}, "gpus_per_worker": 1}


def test_a_sweep_task_gets_its_values_and_the_array_variables():
    spec = Template(SPEC, 3).render({"parameters": {"lr": "0.1"}}, 2)
    assert spec["command"] == ["train", "--lr=0.1", "--seed=2"]
    assert spec["env"] == {"RUN": "r2-0.1", "ISTHMUS_ARRAY_INDEX": "2", "ISTHMUS_ARRAY_COUNT": "3"}
    assert spec["parameters"] == {"lr": "0.1"} and spec["image"] == "busybox"
    assert SPEC["command"][1] == "--lr={{ lr }}"  # the stored template is not changed


def test_an_argv_item_stays_one_item_whatever_the_value_holds():
    command, _ = render_task(["echo", "{{ x }}"], {}, {"x": "a b; rm -rf /", "index": "0"}, 1)
    assert command == ["echo", "a b; rm -rf /"]


def test_unknown_placeholder_names_the_field():
    assert unknown_names(["a", "{{ lr }}"], {}, {"index"}) == ("body.command[1]", "lr")
    assert unknown_names([], {"K": "{{ nope }}"}, {"index"}) == ("body.env.K", "nope")
    assert unknown_names(["{{ index }}"], {}, {"index"}) is None


def test_values_are_written_json_like_and_only_rendered_keys_differ():
    assert (format_value(True), format_value(1.5), format_value(3)) == ("true", "1.5", "3")
    assert {"command", "env", "parameters"} == RENDERED
