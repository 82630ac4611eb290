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


def test_root_logging_is_kept_when_a_library_configures_it():
    from mtpkit.export.scoped import root_logging_kept

    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    with root_logging_kept():
        logging.basicConfig(level=logging.INFO)  # what onnxruntime 1.32's quantization modules do at import
    assert (root.handlers, root.level) == before


class Composite:
    """Like a composite HF config: setting the parent's value also sets its sub-config's."""

    def __init__(self):
        self.sub = Child()
        self._impl = "parent"

    @property
    def impl(self):
        return self._impl

    @impl.setter
    def impl(self, v):
        self._impl = v
        self.sub.impl = v


def test_patched_all_reads_every_old_value_before_setting_any():
    from mtpkit.export.scoped import patched_all

    parent = Composite()
    parent.sub.impl = "eager"
    with patched_all([parent, parent.sub], "impl", "lrt"):
        assert parent.impl == parent.sub.impl == "lrt"
    assert (parent.impl, parent.sub.impl) == ("parent", "eager")


def test_third_party_import_noise_is_hidden_and_levels_restored():
    """A fresh process loading a checkpoint the way export does prints nothing from torchao or torch._pytree."""
    import subprocess
    import sys

    code = ("import logging\n"
            "from mtpkit.export.scoped import import_quietly\n"
            "import_quietly()\n"
            "import transformers.quantizers.auto\n"
            "assert logging.getLogger('torchao').level == logging.getLogger('torch.utils._pytree').level == 0\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Failed to load" not in result.stderr and "register_constant" not in result.stderr, result.stderr


def test_output_captured_hides_fd_output_and_replays_it_on_failure(capfd):
    import os

    from mtpkit.export.scoped import output_captured

    with output_captured("tool"):
        print("python print", flush=True)
        os.write(2, b"native log line\n")
    assert capfd.readouterr() == ("", "")
    with pytest.raises(RuntimeError), output_captured("tool"):
        os.write(1, b"what it said before failing\n")
        raise RuntimeError("boom")
    assert "what it said before failing" in capfd.readouterr().err
    print("after")
    assert capfd.readouterr().out == "after\n"  # descriptors restored
