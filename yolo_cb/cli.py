"""`yolo-cb MODE key=value ...`: argv -> settings -> the YOLO facade.

Modes: train, val, predict, export, tune, benchmark; and `yolo-cb cfg | callbacks | settings | checks | copy-cfg | help | version`.
This module loads no torch: it answers everything the command line and the files it names decide, then hands the modes
that need torch (and `checks`) to yolo_cb/cli_run.py, imported in one place, in run().
A usage error, or any error the user can fix (yolo_cb.errors.UserError: bad settings, data, checkpoint, an
unwritable project=), prints one clear message (no traceback) and exits with status 2; other errors are bugs
and keep their traceback (exit 1).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from yolo_cb.assembly.assemble import build_trainer_callbacks
from yolo_cb.data.check import check_dataset, format_report
from yolo_cb.data.convert import convert
from yolo_cb.data.dataset_yaml import read_dataset
from yolo_cb.errors import UserError
from yolo_cb.settings.config import Config, check_overrides, coerce, describe_settings, get_config, load_defaults, names_a_resume
from yolo_cb.settings.ultralytics_keys import ULTRALYTICS_KEYS, unknown_key_message  # noqa: F401 (ULTRALYTICS_KEYS: read here before)
from yolo_cb.settings.user import USER_KEYS, check_key, load_user_settings, reset_user_settings, save_user_settings, settings_path
from yolo_cb.utils.log import printable, setup_logging
from yolo_cb.utils.paths import DEFAULT_CFG, DEFAULT_MODEL
from yolo_cb.utils.signal_stack import signal_deadline
from yolo_cb.utils.suggest import did_you_mean
from yolo_cb.version import __version__

MODES = ("train", "val", "predict", "track", "export", "tune", "benchmark")
SPECIAL = ("cfg", "callbacks", "settings", "checks", "copy-cfg", "convert", "data", "help", "version")
DATA_KEYS = {"convert": ("source", "format", "out", "names"), "data": ("data", "datasets_dir")}  # their own keys
DATA_MODES = ("train", "val", "tune", "benchmark")  # the modes whose run resolves data= (export reads it for int8 only)
COPY_NAME = "default_copy.yaml"  # what copy-cfg writes in the working directory (Ultralytics' name)

HELP = """\
yolo-cb: train, validate, export and run YOLOX detectors; the training loop is driven by callbacks.

Usage:
  yolo-cb MODE key=value ...      MODE is one of: train val predict track export tune benchmark
  yolo-cb cfg                     every setting with its default and meaning
  yolo-cb callbacks [key=value]   the callbacks a training with these settings runs, per event, in firing order
  yolo-cb settings [key=value]    your own defaults for the integrations (mlflow=False comet=True ...); `reset` clears them
  yolo-cb checks | copy-cfg       this machine's versions and hardware; default.yaml copied here as default_copy.yaml
  yolo-cb convert source=instances_train.json format=coco|voc|labelme|labelstudio out=mydata   (YOLO labels + data.yaml)
  yolo-cb data check data=mydata.yaml   counts per split and class, backgrounds, duplicates, tiny or outside boxes
  yolo-cb cfg=my.yaml key=value   no mode word: train with that settings file (as Ultralytics)
  yolo-cb help | version

Examples:
  yolo-cb train data=shapes.yaml epochs=10 imgsz=320   (model= empty: yolocb-n.yaml; model=yolox-nano.yaml for YOLOX)
  yolo-cb train data=coco8.yaml callbacks=on_fit_epoch_end=mypkg.cbs:stop_at_target
  yolo-cb val model=runs/detect/train/weights/best.pt data=shapes.yaml
  yolo-cb export model=runs/detect/train/weights/best.pt format=onnx
  yolo-cb export model=best.pt format=ncnn        (or mnn, tflite, executorch, coreml: pip install 'yolo-cb[ncnn]' ...)
  yolo-cb predict model=runs/detect/train/weights/best.onnx source=path/to/images
  yolo-cb benchmark model=runs/detect/train/weights/best.pt data=shapes.yaml formats=onnx,onnx_int8,openvino
  yolo-cb tune data=shapes.yaml iterations=8 epochs=5 imgsz=128   (needs pip install 'yolo-cb[tune]')
  torchrun --nproc_per_node 2 -m yolo_cb train data=shapes.yaml device=cpu

Docs: README.md and docs/ (callbacks.md, cli.md, datasets.md, export.md, distributed.md, metrics.md, tune.md)."""


class UsageError(Exception):
    """Bad command line; printed as one message, exit status 2."""


HELP_FLAGS = ("-h", "--help", "-help")
TASK_WORDS = ("detect", "segment", "classify", "pose", "obb")  # Ultralytics' `yolo TASK MODE ...`: here the task is detection
EMPTY_IS_DEFAULT = ("opset", "channels_last", "nms")  # Ultralytics writes `opset=` / `nms=` ... for "the default"


def mode_word_error(mode: str, rest: list[str]) -> UsageError:
    """The one line for a first word that is no mode: a task word to drop, a misspelt mode, a key=value put first."""
    if mode in TASK_WORDS:
        return UsageError(f"'{mode}' is Ultralytics' task word; yolo-cb only detects, so drop it: yolo-cb {' '.join(rest) or 'train ...'}")
    hint = " Put the mode first, e.g. `yolo-cb train data=shapes.yaml`." if "=" in mode else did_you_mean(mode, MODES + SPECIAL)
    return UsageError(f"'{mode}' is not a mode.{hint} Modes: {', '.join(MODES + SPECIAL)}")


def unknown_key_error(key: str, valid: dict) -> UsageError:
    return UsageError(unknown_key_message(key, valid))


def missing_equals_error(token: str, mode: str, rest: list[str], valid: dict) -> UsageError:
    """The one line for a bare key (`resume`): the key=value to write, as a whole command where it can be told."""
    if token == "resume":
        named = next((t.partition("=")[2] for t in rest if t.startswith("model=")), "")
        others = " ".join(t for t in rest if t != token and not t.startswith("model="))
        fix = f"yolo-cb {mode} resume={named} {others}".strip() if named.endswith((".pt", ".pth")) else f"yolo-cb {mode} resume=True"
        return UsageError(f"'resume' needs '=': write `{fix}` (resume=True: the newest last.pt; resume=path: that checkpoint)")
    following = "True" if isinstance(valid.get(token), bool) else "VALUE"
    return UsageError(f"'{token}' needs '=': write {token}={following} (yolo-cb arguments are key=value)")


def parse_args(argv: list[str]) -> tuple[str, dict[str, str]]:
    """argv -> (mode, {key: raw string value}); refuses `key value` and unknown keys with hints."""
    if not argv:
        raise UsageError("no mode given. Usage: yolo-cb MODE key=value ... (MODE: train, val, predict, export, tune, benchmark; or cfg, help, version)")
    mode, rest = argv[0], argv[1:]
    if mode.startswith("cfg="):  # `yolo-cb cfg=custom.yaml ...`: a settings file and no mode word trains, as Ultralytics
        mode, rest = "train", argv
    if mode in HELP_FLAGS:
        return "help", {}
    if mode not in MODES + SPECIAL:
        raise mode_word_error(mode, rest)
    valid = load_defaults()
    overrides: dict[str, str] = {}
    for i, token in enumerate(rest):
        if token.startswith("--"):
            token = token[2:]
            if "=" in token:
                print(f"WARNING '--{token}': yolo-cb arguments are written key=value without dashes; accepted as '{token}'", file=sys.stderr)
            elif token in ("help", "h"):
                return "help", {}
        if token in HELP_FLAGS:
            return "help", {}
        if "=" not in token:
            if token in valid:
                following = rest[i + 1] if i + 1 < len(rest) else ""
                if "=" in following or not following:
                    raise missing_equals_error(token, mode, rest, valid)
                raise UsageError(f"'{token}' needs '=': write {token}={following} (yolo-cb arguments are key=value)")
            raise UsageError(f"'{token}' is not a key=value argument.{did_you_mean(token, valid)} See all with `yolo-cb cfg`.")
        key, _, value = token.partition("=")
        key = key.strip().replace("-", "_")
        if key not in valid:
            raise unknown_key_error(key, valid)
        if key == "mode":
            raise UsageError("give the mode as the first word (yolo-cb train ...), not as mode=")
        if not (value == "" and key in EMPTY_IS_DEFAULT):  # `opset=`: the default, as in Ultralytics
            overrides[key] = value
    return mode, overrides


def refuse_missing_inputs(mode: str, overrides: dict[str, str]) -> None:
    """At once, before torch is imported: val/predict/export need model=, predict needs source= (Ultralytics falls back to
    its sample images; yolo-cb has none). A cfg= file may give them: then the facade checks."""
    if "cfg" in overrides:
        return
    weights = overrides.get("model") or "runs/detect/train/weights/best.pt"
    if mode in ("val", "predict", "export") and not overrides.get("model"):
        raise UsageError(f"{mode} needs model=: trained weights (.pt, .onnx or .torchscript), e.g. yolo-cb {mode} model={weights}")
    if mode == "predict" and not overrides.get("source"):
        raise UsageError(f"predict needs source=: an image, folder, glob, video or .txt list, e.g. yolo-cb predict model={weights} "
                         f"source=path/to/images")


def refuse_bad_data(mode: str, args) -> None:
    """At once, before torch is imported: the data YAML that this mode's run resolves, checked as far as the file itself
    decides (found, parsed, its keys, names, nc, category_ids and the form of its splits: data/dataset_yaml.py). Whether
    its images are there is the run's to say: its download:, generate: or an on_pretrain_routine_start callback may
    still bring them."""
    if mode in DATA_MODES and args.data:
        read_dataset(args.data, args.datasets_dir)


def names_a_checkpoint(args: Config) -> bool:
    """Whether model= names a checkpoint: `yolo-cb callbacks` then leaves its table to the facade (cli_run.py), which reads it."""
    return str(args.model or "").endswith((".pt", ".pth"))


def callbacks_table(args: Config, overrides: dict[str, str]) -> str:
    """`yolo-cb callbacks` with no checkpoint named as the model: the callbacks `yolo-cb train` with these settings runs,
    per event in firing order, built without torch."""
    return build_trainer_callbacks(get_config({**overrides, "model": args.model or DEFAULT_MODEL, "mode": "train"})).table()


def copy_cfg(folder: Path | None = None) -> Path:
    """`yolo-cb copy-cfg` (Ultralytics' `yolo copy-cfg`): cfg/default.yaml copied to <folder>/default_copy.yaml (never over
    an existing file), and how to use it."""
    target = Path(folder or Path.cwd()) / COPY_NAME
    if target.exists() or target.is_symlink():
        raise UserError(f"{target} exists; copy-cfg does not overwrite it: move it away or edit it (yolo-cb train cfg={target.name})")
    shutil.copyfile(DEFAULT_CFG, target)
    print(f"{DEFAULT_CFG} copied to {target}: edit it, then yolo-cb train cfg={target.name}")
    return target


def print_settings() -> None:
    for key, default, comment in describe_settings():
        if key == "#":
            print(f"\n# {default}")
        else:
            shown = "" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
            print(f"{key:<24} {shown:<12} {comment}")


def settings_command(rest: list[str]) -> None:
    """`yolo-cb settings`: show the user's settings file; `key=value ...`: type, check and save them; `reset`: delete it."""
    if rest == ["reset"]:
        print(f"removed {reset_user_settings()} (every setting is back to cfg/default.yaml's)")
        return
    values = {}
    for token in rest:
        key, sep, value = token.partition("=")
        if not sep:
            raise UsageError(f"'{token}' is not key=value: write e.g. `yolo-cb settings mlflow=False comet=True`, or `yolo-cb settings reset`")
        key = key.strip().replace("-", "_")
        check_key(key, "")
        values[key] = coerce(key, value)
    if values:
        print(f"saved {save_user_settings(values)}")
    path, saved = settings_path(), load_user_settings()
    print(f"# {path}{'' if path.is_file() else ' (no file yet)'}; YOLO_CB_CONFIG_DIR moves it")
    defaults = load_defaults()
    for key in USER_KEYS:
        shown = saved.get(key, defaults.get(key))
        print(f"{key:<14} {'' if shown is None else str(shown).lower() if isinstance(shown, bool) else shown:<8} "
              f"{'(yours)' if key in saved else '(default)'}")


def data_command(argv: list[str]) -> None:
    """`yolo-cb convert source=... format=... out=... [names=a,b]` and `yolo-cb data check data=... [datasets_dir=...]`."""
    command, rest = argv[0], argv[1:]
    if command == "data":
        if rest[:1] != ["check"]:
            raise UsageError("`yolo-cb data` has one action: `yolo-cb data check data=mydata.yaml`")
        rest = rest[1:]
    keys = DATA_KEYS[command]
    values: dict[str, str] = {}
    for token in rest:
        key, sep, value = token.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or key not in keys:
            raise UsageError(f"'{token}' is not one of {command}'s key=value arguments ({', '.join(keys)}).{did_you_mean(key, keys)}")
        values[key] = value
    needed = ("source", "format", "out") if command == "convert" else ("data",)
    missing = [k for k in needed if not values.get(k)]
    if missing:
        example = "yolo-cb convert source=annotations.json format=coco out=mydata" if command == "convert" else "yolo-cb data check data=mydata.yaml"
        raise UsageError(f"{'data check' if command == 'data' else command} needs {', '.join(f'{k}=' for k in missing)}: e.g. {example}")
    setup_logging()
    if command == "convert":
        convert(values["source"], values["format"].lower(), values["out"], values.get("names"))  # it logs the data.yaml it wrote
        return
    report = format_report(*check_dataset(values["data"], values.get("datasets_dir") or None))
    print("\n".join(printable(line) for line in report.splitlines()))  # class names come from the user's files


def answer(mode: str) -> object:
    """help, version, cfg and copy-cfg: what they print (copy-cfg: the file it wrote)."""
    if mode == "copy-cfg":
        return copy_cfg()
    if mode == "cfg":
        print_settings()
    else:
        print(HELP if mode == "help" else __version__)
    return None


def check_resume(overrides: dict[str, str]) -> None:
    """`yolo-cb train resume=...`: each given key and value checked before torch loads; the run's settings (the
    checkpoint's, under these) are then resolved once, by the resume's plan in train()."""
    check_overrides(overrides)
    setup_logging(verbose=coerce("verbose", overrides.get("verbose", load_defaults()["verbose"])))  # the plan's lines too


def settle(mode: str, overrides: dict[str, str]) -> Config | None:
    """The settings of `mode`, checked as far as the command line and its files decide: the inputs it needs, every key
    and value (type and range errors surface here, before any work), its data YAML. None for a resume (checked here;
    its plan resolves its settings from the checkpoint)."""
    refuse_missing_inputs(mode, overrides)
    if mode == "train" and names_a_resume(overrides.get("resume")):  # resume= a path, true or auto
        check_resume(overrides)
        return None
    args = get_config({**overrides, "mode": "train" if mode == "callbacks" else mode})
    setup_logging(verbose=args.verbose)
    refuse_bad_data(mode, args)
    return args


def run(argv: list[str]) -> object:
    """Run one command line (argv without the program name); returns what its mode returns."""
    if argv[:1] == ["settings"]:
        return settings_command(argv[1:])
    if argv[:1] in (["convert"], ["data"]):
        return data_command(argv)
    mode, overrides = parse_args(argv)
    if mode in ("help", "version", "cfg", "copy-cfg"):
        return answer(mode)
    args = None if mode == "checks" else settle(mode, overrides)
    if mode == "callbacks" and not names_a_checkpoint(args):
        print(callbacks_table(args, overrides))
        return None
    from yolo_cb.cli_run import run_mode  # it loads torch: everything above answers without it (tests/test_cli_no_torch.py)

    return run_mode(mode, args, overrides)


def user_error(error: BaseException) -> BaseException | None:
    """The error to print as one line when `error` is the user's to fix, else None (a bug: keep the traceback).

    User errors: UsageError, every yolo_cb.errors.UserError (ConfigError, DataError, CheckpointError, WriteError),
    FileNotFoundError, a refused unsafe checkpoint, and any of those raised inside a callback or a step of the loop
    (a full disk met while the saver writes)."""
    callback_error = getattr(sys.modules.get("yolo_cb.callbacks.dispatch"), "CallbackError", ())  # first: it also has the original's type
    if callback_error and isinstance(error, callback_error):
        return RuntimeError(f"{error.error} (in callback '{error.callback_name}', event '{error.event}')") if user_error(error.error) else None
    unsafe = getattr(sys.modules.get("yolo_cb.checkpoints.checkpoint"), "UnsafeCheckpointError", ())
    if isinstance(error, (UsageError, UserError, FileNotFoundError, *((unsafe,) if unsafe else ()))):
        return error
    return None


def entrypoint(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        with signal_deadline(past_block=True):  # after Ctrl-C / SIGTERM the process ends within seconds, stuck or not
            run(argv)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # e.g. `yolo-cb cfg | head`
        sys.stderr.close()
    except Exception as error:
        shown = user_error(error)
        if shown is None:
            raise  # a bug: the traceback is what helps
        message = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(shown))  # no terminal escapes from wrapped library messages
        print(f"yolo-cb: error: {message}", file=sys.stderr)
        sys.exit(2)
