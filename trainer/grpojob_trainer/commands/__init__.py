"""What each `grpojob` command does; `grpojob_trainer.cli` parses the arguments and reports errors."""
