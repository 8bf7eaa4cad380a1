"""Image-quality metrics: FID with the Inception network of pytorch-fid (:mod:`.frechet`) and
FD-MNIST with the shipped digit classifier (:mod:`.fd_mnist`); beside them the CLIP score of
text-to-image samples with their captions (:mod:`.clip_score`). This package's top imports
nothing heavy, so the configuration validates metric names without loading torch."""

METRIC_NAMES = ("fd-mnist", "fid")
