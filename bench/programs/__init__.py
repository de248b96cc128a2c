"""Ports of real public training programs, each with bugs reported for its kind of program.

A held-out evaluation of nndx on training code nobody here wrote (issue 14): never tune
rules on it. ``python -m bench.programs`` runs every program x variant and prints the
table; see ``bench/README.md`` ("programs") and :mod:`bench.programs.harness`.
"""

# module names, in the order the table lists them
PROGRAMS = (
    "mnist",
    "mnist_rnn",
    "word_language_model",
    "dcgan",
    "vae",
    "time_sequence_prediction",
    "nanogpt",
    "makemore",
    "regression",
    "siamese_network",
    "super_resolution",
    "gcn",
    "transfer_learning",
    "language_translation",
    "deep_residual_network",
    "char_rnn_classification",
    "transformer_tutorial",
    "mlp_gan",
    "glue_no_trainer",
    "text_classification",
    "lstm_tagger",
    "seq2seq_translation",
    "dqn",
    "nn_tutorial",
    "spatial_transformer",
    "llm_from_scratch_gpt",
    "forward_forward",
    "quickstart",
    "cifar10_tutorial",
    "bilstm_crf",
    "ngram_lm",
    "actor_critic",
    "char_rnn_generation",
    "unet",
    "chatbot",
    "ddpm",
    "wgan_gp",
    "simclr",
    "gat",
)
