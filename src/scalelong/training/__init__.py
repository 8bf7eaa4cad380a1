"""The application's trainer: the YAML configuration and its presets (:mod:`.config`,
:mod:`.presets`), building a run's model and data (:mod:`.build`), the training loop
(:mod:`.train`) and its evaluations (:mod:`.evaluation`), run folders and checkpoints
(:mod:`.runs`, :mod:`.checkpoint`), processes and devices (:mod:`.launch`), exporting samples
(:mod:`.export`), users' own models (:mod:`.user_model`) and the text-to-image recipe
(:mod:`.t2i`). Nothing in the library imports it."""
