"""Trainers' loggers: each step's loss scale and its other values, logged where a trainer
logs its own, so that every logger it has (every ``report_to``) gets them, with no mirror.

``scalewatch.integrations.lightning.LossScaleLogger`` (a Lightning callback) and
``scalewatch.integrations.transformers.report_loss_scale(trainer)`` (Hugging Face's
Trainer). Each adds a tap (``_tap.StepTap``, a mirror) to the scaler the trainer steps with
as training begins; the tap is written on its own thread, and the callback hands what it
holds to the trainer's loggers on the training thread, as the trainer logs.
"""
