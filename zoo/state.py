"""What zoo.get knows about a module it returns, kept on the module as one typed object.

It sits this low so that materialize and analysis (below the registry) read it as the load layer does.
"""

from dataclasses import dataclass

from zoo.recipe import Recipe

# The one attribute, set in the instance dict: nn.Module's __setattr__ and state_dict never see it, while
# deepcopy and pickle copy it with the module.
_KEY = "_zoo"


@dataclass(frozen=True)
class ZooState:
    """recipe: how to rebuild the module (initialization, non-persistent buffers, published weights).
    name, url: its registry row, read when weights= names a tag recorded for it.
    tag: a variant row's weights tag (its published weights, the input size it was recorded at), else None.
    inputs: a user builder's recorded inputs (scan and estimate run with them), else None.
    load_args: the row's recorded load arguments (zoo.families.base.load_arguments) where the module is the row's
    own build (no kwargs overrides), else None.
    ties: the names of each tensor the module was built with under several names: sharding may untie them
    (tensor parallelism distributes an embedding and its tied head separately), and materialize then fills
    each from the one key a checkpoint keeps for them."""

    recipe: Recipe
    name: str | None = None
    url: str | None = None
    tag: str | None = None
    inputs: list | None = None
    load_args: dict | None = None
    ties: tuple[tuple[str, ...], ...] = ()


def state_of(module) -> ZooState | None:
    """The zoo state of a module zoo.get returned; None for any other module (a wrapper such as DDP too)."""
    state = getattr(module, "__dict__", {}).get(_KEY)
    return state if isinstance(state, ZooState) else None


def set_state(module, state: ZooState) -> None:
    module.__dict__[_KEY] = state
