"""export/scoped.py: every patch of another library's object is undone, also when the block raises."""

from __future__ import annotations

import logging

import pytest

from mtpkit.export.scoped import logger_level, patched


class Base:
    greeting = "hello"

    def method(self):
        return "method"


class Child(Base):
    def __init__(self):
        self._value = 1

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        self._value = v


def test_class_attribute_is_restored_and_inherited_one_not_copied_down():
    with patched(Child, "greeting", "hi"):
        assert Child().greeting == "hi"
    assert "greeting" not in Child.__dict__ and Child().greeting == "hello"


def test_instance_method_override_is_removed_and_property_restored_on_error():
    obj = Child()
    with pytest.raises(RuntimeError), patched(obj, "method", lambda: "patched"), patched(obj, "value", 7):
        assert obj.method() == "patched" and obj.value == 7
        raise RuntimeError
    assert obj.method() == "method" and "method" not in obj.__dict__ and obj.value == 1


def test_logger_level_is_restored():
    log = logging.getLogger("mtpkit.test.scoped")
    log.setLevel(logging.INFO)
    with logger_level(log.name, logging.ERROR):
        assert log.level == logging.ERROR
    assert log.level == logging.INFO
