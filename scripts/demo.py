"""`make demo`: the whole user journey on the built-in, offline `shapes` dataset.

Trains the default model (YOLOCB-n, what `YOLO()` and an empty `model=` give) for 12 epochs (the last
three without mosaic), prints its final mAP50-95, validates best.pt, exports it to ONNX (verified
against PyTorch), predicts on validation images, and prints where everything is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from yolo_cb import YOLO
from yolo_cb.data.resolve import check_data
from yolo_cb.utils.files import default_project

PROJECT = Path("runs/demo")
IMGSZ = 256  # train/val/export size: 12 epochs take about 5 minutes on 2 quiet cores
# The CPU recipe of BENCHMARKS.md (one optimizer step per batch, serial loading on 2 cores);
# the last 3 epochs train without mosaic (close_mosaic).
SETTINGS = dict(data="shapes.yaml", imgsz=IMGSZ, epochs=12, close_mosaic=3, batch=16, nbs=16, optimizer="AdamW", lr0=0.002,
                warmup_epochs=1.0, workers=0, project=str(PROJECT / "train"), name="shapes", exist_ok=True, plots=True)


def main() -> int:
    model = YOLO()  # the default model: yolocb-n.yaml
    curve: list[float] = []  # mAP50-95 after each epoch, filled by the callback

    def report_epoch(trainer):
        curve.append(float(trainer.metrics.get("metrics/mAP50-95(B)", 0)))
        print(f"[demo callback] epoch {trainer.epoch + 1}: mAP50-95 {curve[-1]:.3f}")

    model.add_callback("on_fit_epoch_end", report_epoch)
    model.train(**SETTINGS)
    trainer = model.trainer
    metrics = model.val(data="shapes.yaml", imgsz=IMGSZ, project=str(PROJECT / "val"), name="shapes", exist_ok=True)
    onnx_path = model.export(format="onnx", imgsz=IMGSZ)
    val_images = check_data("shapes.yaml")["val"]
    predict_dir = PROJECT / "predict" / "shapes"
    results = model.predict(source=val_images, imgsz=IMGSZ, project=str(predict_dir.parent), name=predict_dir.name, exist_ok=True, save=True,
                            save_txt=True)
    save_dir = Path(trainer.save_dir)
    print(f"\n=== yolo-cb demo: {trainer.model_source} trained {len(curve)} epochs, final mAP50-95 {curve[-1]:.3f} ===")
    print("\n=== yolo-cb demo: where the results are ===")
    print(f"weights        {save_dir / 'weights' / 'best.pt'}  (and last.pt)")
    print(f"results.csv    {save_dir / 'results.csv'}  (results.png beside it)")
    print(f"plots          {save_dir}/*.png, train_batch*.jpg, val_batch0_*.jpg")
    events = sorted(save_dir.glob("events.out.tfevents.*"))
    print(f"tensorboard    {len(events)} event file(s) in {save_dir}: tensorboard --logdir {save_dir}")
    print(f"mlflow         {mlflow_summary(Path(trainer.args.project or default_project(trainer.args)))}")
    print(f"val            mAP50-95 {metrics.get('metrics/mAP50-95(B)', 0):.3f}, plots in {PROJECT / 'val' / 'shapes'}")
    print(f"onnx           {onnx_path}")
    print(f"predictions    {predict_dir} ({len(results)} images)")
    return 0


def mlflow_summary(project: Path) -> str:
    """The MLflow runs in the demo's local store, read back with the client."""
    import os

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(project.resolve() / 'mlruns' / 'mlflow.db')}"
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
        listed = ", ".join(f"{r.info.run_name} {r.info.status} ({len(r.data.metrics)} metrics)" for r in runs[:3])
        return f"{len(runs)} run(s) in {uri}: {listed} -> mlflow ui --backend-store-uri {uri}"
    except Exception as error:  # the demo reports; it does not fail on a viewer problem
        return f"could not read {uri}: {error}"


if __name__ == "__main__":
    sys.exit(main())
