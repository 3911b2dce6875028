"""Option types and checks that `decode`, `generate` (which shares decode's options) and their tests use:
gamma as an int or "auto", the seed as an int or "random", the temperature by generate()'s rule, and the
options as one SamplingSettings."""
from __future__ import annotations

import click

from specsample_cupy.decode.call_args import resolve_temperature
from specsample_cupy.settings import SamplingSettings


class GammaType(click.ParamType):
    """An int >= 0 or "auto" (generate()'s automatic gamma)."""
    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, int) and value >= 0:
            return value
        try:
            gamma = int(value)
        except ValueError:
            gamma = -1
        if gamma < 0:
            self.fail(f"{value!r} is neither an integer >= 0 nor 'auto'", param, ctx)
        return gamma


RANDOM_SEED = "random"


class SeedType(click.ParamType):
    """An int, or "random": None, a base seed the decoder draws from the operating system (and reports)."""
    name = "INT|random"

    def convert(self, value, param, ctx):
        if value is None or value == RANDOM_SEED or isinstance(value, int) and not isinstance(value, bool):
            return None if value == RANDOM_SEED else value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor 'random'", param, ctx)


def checked_temperature(method: str, temperature) -> float:
    """--temperature as the decoder takes it (generate()'s rule: left out, 1, or 0 for --method greedy,
    which takes no other value), or a usage error."""
    try:
        return resolve_temperature(method, temperature, "--temperature")
    except ValueError as exc:
        hint = " or --method greedy" if temperature == 0 else ""
        raise click.BadParameter(f"{exc}{hint}", param_hint="--temperature") from None


def sampling_settings(**options) -> SamplingSettings:
    """The command's sampling options as one SamplingSettings (its checks), or a usage error (the
    temperature first, in the options' words: checked_temperature)."""
    options["temperature"] = checked_temperature(options.get("method", "exact"), options.get("temperature"))
    try:
        return SamplingSettings(**options)
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
