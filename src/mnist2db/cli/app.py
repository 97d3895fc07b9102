"""The ``mnist2db`` click group: the table of its commands, loaded when they are used.

Each command lives in a module of this package (``convert_commands``, ``data_commands``,
``export_commands``, ``training_commands``, ``fetch_commands``, ``imageset_commands``) that imports what it needs at its top. The group
imports a command's module only when that command runs or shows its help, so
``mnist2db --help`` and shell completion of the command names load click alone (the
operations pull in numpy, lmdb, plyvel and protobuf: about ten times click's start-up).
"""

from __future__ import annotations

import importlib
import sys

import click

from mnist2db.interrupt import run
from mnist2db.version import __version__

#: Every command, in the order ``mnist2db --help`` lists them: the module that defines it
#: (in this package) and the summary that ``--help`` shows without importing it.
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("convert_commands", "Convert IDX images and labels into a Datum database."),
    "fetch": ("fetch_commands", "Download a dataset's IDX files, verified and unpacked."),
    "create": ("fetch_commands", "Write a fetched dataset's train and test databases."),
    "show": ("data_commands", "Show records of an IDX file or a database as images."),
    "info": ("data_commands", "Describe an IDX file or a database: header, shape, labels."),
    "verify": ("data_commands", "Check that a database holds exactly its sources' records."),
    "export": ("export_commands", "Write a database back out: IDX files, image files, or shards."),
    "mean": ("training_commands", "Compute a database's mean image, as compute_image_mean."),
    "siamese": ("training_commands", "Write random image pairs for Caffe's siamese example."),
    "imageset": ("imageset_commands", "Convert your own images (a list or class folders)."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported from :data:`COMMANDS` when first used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(f"mnist2db.cli.{entry[0]}")
        command: click.Command = getattr(module, cmd_name)
        command.short_help = entry[1]
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mnist2db")
def cli() -> None:
    """Fetch MNIST-format IDX files and convert them to Caffe Datum databases.

    The databases are byte-for-byte what Caffe's convert_mnist_data writes, in LMDB or
    LevelDB.

    \b
    Examples:
      mnist2db fetch
      mnist2db convert --backend=lmdb data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/mnist/mnist_train_lmdb
      mnist2db show examples/mnist/mnist_train_lmdb --count 3

    \b
    Shell completion, in ~/.bashrc (zsh_source, fish_source for zsh and fish):
      eval "$(_MNIST2DB_COMPLETE=bash_source mnist2db)"
    """


def main(args: list[str] | None = None, prog_name: str | None = None) -> None:
    """Run the click command line; SIGINT/SIGTERM clean up and exit 130/143 with one line."""
    # cli.main exits on its own (standalone mode); returning means success.
    sys.exit(run(lambda: cli.main(args=args, prog_name=prog_name or "mnist2db")))
