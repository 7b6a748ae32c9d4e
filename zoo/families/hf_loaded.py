"""A transformers model zoo loaded, left in the state `from_pretrained` leaves it in.

`from_pretrained(DIR)` returns the model in eval mode, with `name_or_path` set to DIR, the config fields of
DIR/config.json and the generation settings of DIR/generation_config.json; a model built from the registry's
config and filled in place has none of these until they are set here, from the same files (read as
zoo reads any config: bounded, JSON only).
"""

from pathlib import Path

from zoo.families.hf import read_config
from zoo.families.hf_keys import is_transformers_model


def as_from_pretrained(module, folder: Path | None, name_or_path: str | None, mode: bool = True) -> None:
    """Eval mode (when `mode`: a lazy load leaves the mode the user set since), and, where `folder` holds a
    config.json, its fields, `name_or_path` and its generation config. A no-op for any other model."""
    if not is_transformers_model(module):
        return
    if mode:
        module.eval()
    if folder is None or not (folder / "config.json").is_file():
        return  # from_pretrained could not read this folder: nothing of it to take
    config = module.config
    read = type(config).from_dict(read_config(folder / "config.json"))
    for key, value in vars(read).items():  # in place: the model's submodules hold this same config object
        # private ones are the model's own settings (_attn_implementation), which from_pretrained sets too
        if not key.startswith("_") and getattr(config, key, None) != value:
            setattr(config, key, value)
    config.name_or_path = module.name_or_path = name_or_path  # what from_pretrained was given
    if module.can_generate():
        from transformers import GenerationConfig

        file = folder / "generation_config.json"
        module.generation_config = (
            GenerationConfig.from_dict(read_config(file))
            if file.is_file()
            else GenerationConfig.from_model_config(config)
        )
