"""The AMX plugin: a server process asks for AMX tile state exactly where the CPU has AMX tiles,
and not when switched off (stand-in `torch.cpu` modules; the real crash and fix are measured in
the plugin's docstring and docs/startup.md)."""
from __future__ import annotations

import pytest

from harness.serve.plugins.startup import cpu_amx


class FakeCpu:
    def __init__(self, tiles: bool, granted: bool = True) -> None:
        self.tiles, self.granted, self.asked = tiles, granted, 0

    def _is_amx_tile_supported(self) -> bool:
        return self.tiles

    def _init_amx(self) -> bool:
        self.asked += 1
        return self.granted


def test_a_cpu_with_amx_tiles_is_asked_once_per_call():
    cpu = FakeCpu(tiles=True)
    assert cpu_amx.ask_for_amx(cpu) is True
    assert cpu.asked == 1


def test_a_cpu_without_amx_tiles_is_not_asked():
    cpu = FakeCpu(tiles=False)
    assert cpu_amx.ask_for_amx(cpu) is False
    assert cpu.asked == 0


def test_a_refusal_is_reported():
    assert cpu_amx.ask_for_amx(FakeCpu(tiles=True, granted=False)) is False


def test_an_old_torch_without_the_calls_is_left_alone():
    assert cpu_amx.ask_for_amx(object()) is False


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), ("off", False),
                                      ("false", False), (" no ", False)])
def test_the_switch(value, on):
    env = {} if value is None else {cpu_amx.ENV: value}
    assert cpu_amx.wanted(env) is on


def test_register_asks_once_and_never_raises(monkeypatch):
    import torch

    cpu = FakeCpu(tiles=True)
    monkeypatch.setattr(torch, "cpu", cpu)
    monkeypatch.setattr(cpu_amx.register, "done", False)
    monkeypatch.delenv(cpu_amx.ENV, raising=False)
    cpu_amx.register()
    cpu_amx.register()
    assert cpu.asked == 1


def test_register_switched_off_does_not_ask(monkeypatch):
    import torch

    cpu = FakeCpu(tiles=True)
    monkeypatch.setattr(torch, "cpu", cpu)
    monkeypatch.setattr(cpu_amx.register, "done", False)
    monkeypatch.setenv(cpu_amx.ENV, "0")
    cpu_amx.register()
    assert cpu.asked == 0

