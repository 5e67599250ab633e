"""nbgrader's configuration for a minigate course folder; `python -m minigate.course nbgrader DIR` copies this file to
DIR/nbgrader_config.py. nbgrader reads it from the folder it runs in (autograde, validate, the formgrader).

nbgrader only logs an error in this file and carries on with its defaults, so tests/test_nbgrader.py runs the real
nbgrader with it. It imports nothing of minigate: the release step names its preprocessor by a string, so an
environment without minigate fails loudly there instead of silently releasing the answers.

Grading mode needs no setting: a blank exercise fails its check under nbgrader's autograde and validate (which set
NBGRADER_EXECUTION, read by minigate.course.checks), instead of falling back to the reference as it does for learners.
"""

from nbgrader.converters import GenerateAssignment

c = get_config()  # noqa: F821 (nbgrader defines it when it reads this file)

# Seconds one cell may run (nbgrader's default is 30). The slowest cell, lesson 03's training of three models, takes
# under a minute on 2 CPU cores, as every whole lesson does but 08 (80 s). On a GPU lessons 03 and 08 train larger
# models (up to 15 minutes a model on a T4): grade on the CPU (CUDA_VISIBLE_DEVICES=) or raise this.
c.Execute.timeout = 600

# The release learners get: without the self-check answers (the cell tagged `answers`), with the Colab badge opening
# the lesson in lessons/ instead of the solutions; then nbgrader's own steps (the answers become stubs).
c.GenerateAssignment.preprocessors = ["minigate.course.nbgrader_course.release_lesson",
                                      *GenerateAssignment.class_traits()["preprocessors"].default()]

# A check cell a learner deleted is put back from the source and graded (by default it goes to manual grading).
c.OverwriteCells.add_missing_cells = True
