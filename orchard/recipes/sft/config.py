"""The settings of an `orchard train sft` run: a pydantic model read from a YAML or JSON file, with command-line
flags layered on top (`with_overrides`). Field names follow transformers' TrainingArguments where they are one;
`trl_config` turns them into TRL's `SFTConfig`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.core.errors import InvalidRequest, first_problem
from orchard.recipes.common.examples import ExampleFilters


class SFTSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # what to train, on what, where
    inputs: list[Path] = Field(default_factory=list, description="run directories or trajectories.jsonl files")
    model: Path | None = Field(default=None, description="the student: a local Hugging Face model directory")
    out: Path | None = Field(default=None, description="output directory: checkpoints, metrics, final model")
    filters: ExampleFilters = Field(default_factory=ExampleFilters)

    # optimisation
    learning_rate: float = Field(default=1e-5, gt=0)
    num_train_epochs: float = Field(default=3.0, gt=0)
    max_steps: int = Field(default=-1, description="> 0: stop after this many optimizer steps (overrides epochs)")
    per_device_train_batch_size: int = Field(default=1, ge=1)
    gradient_accumulation_steps: int = Field(default=8, ge=1)
    lr_scheduler_type: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    warmup_steps: float = Field(default=0.03, ge=0, description="< 1: a fraction of the training steps")
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    seed: int = 42
    bf16: bool | None = Field(default=None, description="bfloat16 mixed precision; None: where the GPU has it")
    activation_checkpointing: bool = Field(default=False, description="recompute activations in the backward "
                                                                      "pass: less memory, more time")

    # bookkeeping
    logging_steps: int = Field(default=1, ge=1)
    save_steps: int = Field(default=100, ge=1, description="a checkpoint every this many optimizer steps")
    save_total_limit: int | None = Field(default=2, ge=1, description="checkpoints kept (the oldest go first)")

    @classmethod
    def load(cls, path: str | Path) -> SFTSettings:
        """Settings from a `.yaml`/`.yml` or `.json` file; relative paths in it are relative to the file."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidRequest(f"cannot read the config file {path}: {exc.strerror or exc}") from None
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                data = json.loads(text)
        except ValueError as exc:  # json and yaml errors are ValueErrors
            raise InvalidRequest(f"{path} is not valid {path.suffix.lstrip('.').upper() or 'JSON'}: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidRequest(f"{path} must hold a mapping of settings, not {type(data).__name__}")
        settings = cls._validated(data, str(path))
        return settings._relative_to(path.parent, set(data))

    def with_overrides(self, overrides: dict[str, Any]) -> SFTSettings:
        """These settings with `overrides` (None values ignored; keys `filters.NAME` set one filter)."""
        data = self.model_dump()
        for key, value in overrides.items():
            if value is None:
                continue
            if key.startswith("filters."):
                data["filters"][key.removeprefix("filters.")] = value
            else:
                data[key] = value
        return self._validated(data, "the settings")

    def trl_config(self, output_dir: Path, **extra: Any) -> Any:
        """TRL's SFTConfig for these settings. The examples are already tokenized, masked and weighted: TRL
        must use them as given (no truncation, no re-tokenization) and keep the `token_weights` column.
        `extra`: other SFTConfig fields, or replacements of these."""
        from trl import SFTConfig

        fields = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                  "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm",
                  "seed", "activation_checkpointing", "logging_steps", "save_steps", "save_total_limit")
        options = {name: getattr(self, name) for name in fields}
        options.update(bf16=self.use_bf16(), dataloader_pin_memory=_has_gpu(), max_length=None,
                       remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True},
                       save_strategy="steps", report_to=[])
        return SFTConfig(output_dir=str(output_dir), **{**options, **extra})

    def use_bf16(self) -> bool:
        import torch

        supported = _has_gpu() and torch.cuda.is_bf16_supported()
        if self.bf16 and not supported:
            raise InvalidRequest("bf16 needs a GPU with bfloat16 support and there is none here; set bf16 to "
                                 "false (--no-bf16) or leave it unset")
        return supported if self.bf16 is None else self.bf16

    @classmethod
    def _validated(cls, data: dict[str, Any], where: str) -> SFTSettings:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidRequest(f"{where}: {first_problem(exc.errors(), 'settings')}") from None

    def _relative_to(self, base: Path, given: set[str]) -> SFTSettings:
        def resolve(path: Path) -> Path:
            return path if path.is_absolute() else base / path

        update: dict[str, Any] = {}
        if "inputs" in given:
            update["inputs"] = [resolve(path) for path in self.inputs]
        for name in ("model", "out"):
            if name in given and getattr(self, name) is not None:
                update[name] = resolve(getattr(self, name))
        return self.model_copy(update=update)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
