"""Typed seams of the app and the commands: the typed views stay in step with what they describe."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from textual.message_pump import MessagePump

import tokview.ui
from tokview.batch import BatchConfig
from tokview.commands.demo import DemoRunFields, demo_runs
from tokview.store.queries import ListFilter
from tokview.ui.screens.samples import FilterChanges
from tokview.ui.worker_errors import ForwardsWorkerErrors


def test_filter_changes_names_every_list_filter_field_with_its_type() -> None:
    """`set_filters(**changes)` is checked against `FilterChanges`: a filter field missing there could not be
    set by a filter box without a type error."""
    fields = {f.name: f.type for f in dataclasses.fields(ListFilter)}
    changes = {name: ref.__forward_arg__ for name, ref in FilterChanges.__annotations__.items()}
    assert changes == fields


def test_demo_run_fields_are_batch_config_fields() -> None:
    names = {f.name for f in dataclasses.fields(BatchConfig)}
    assert set(DemoRunFields.__annotations__) <= names


def test_each_demo_run_builds_the_batch_config_it_describes() -> None:
    for _label, fields in demo_runs("http://127.0.0.1:1", "http://127.0.0.1:2"):
        config = BatchConfig(**fields)
        assert {name: getattr(config, name) for name in fields} == fields


def test_every_node_that_forwards_worker_errors_is_in_an_app() -> None:
    """The mixin reaches `self.app` (its self-type protocol says so): each class mixing it in must be a
    Screen or Widget, whose `app` is the running app."""
    for module in pkgutil.walk_packages(tokview.ui.__path__, "tokview.ui."):
        importlib.import_module(module.name)
    users = ForwardsWorkerErrors.__subclasses__()
    assert users
    assert [cls.__name__ for cls in users if not issubclass(cls, MessagePump)] == []
