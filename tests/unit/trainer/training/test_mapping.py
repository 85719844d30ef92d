"""`spec.dataset.mapping`: a record of plain prompt columns becomes a NeMo Gym row that our environment servers
run (a system and a user message, the environment in `agent_ref`, the task fields it verifies with); a record
that lacks a column the mapping names is refused naming both."""

from __future__ import annotations

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer.environments.arithmetic import ArithmeticEnvironment
from grpojob_trainer.nemo_gym.protocol import EnvironmentRow, Row
from grpojob_trainer.training.mapping import MappingError, mapped_row

MAPPING = api.DatasetMapping(
    prompt_field="question",
    system_prompt="Answer with the number only.",
    environment="arithmetic",
    fields={"expected_answer": "answer", "difficulty": "level"},
)
RECORD = {"question": "What is 2+3?", "answer": "5", "level": 1, "source": "unused"}


def test_a_record_becomes_the_row_of_its_environment_with_its_task_fields():
    row = mapped_row(RECORD, MAPPING)

    assert row == {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Answer with the number only.", "type": "message"},
                {"role": "user", "content": "What is 2+3?", "type": "message"},
            ]
        },
        "agent_ref": {"type": "responses_api_agents", "name": "arithmetic"},
        "expected_answer": "5",
        "difficulty": 1,
    }
    assert Row.model_validate(row).task_fields()["expected_answer"] == "5"
    EnvironmentRow.model_validate(row)  # our environment servers take it as it is
    assert ArithmeticEnvironment.task.model_validate(row).expected_answer == "5"


def test_without_a_system_prompt_the_prompt_is_the_only_message():
    row = mapped_row({"q": "Hi?"}, api.DatasetMapping(prompt_field="q", environment="lookup"))
    assert row["responses_create_params"]["input"] == [{"role": "user", "content": "Hi?", "type": "message"}]
    assert set(row) == {"responses_create_params", "agent_ref"}


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"answer": "5", "level": 1}, "promptField: no column 'question' (the columns are ['answer', 'level'])"),
        ({"question": "What is 2+3?", "level": 1}, "fields.expected_answer: no column 'answer'"),
        ({"question": None, "answer": "5", "level": 1}, "promptField: column 'question' holds None"),
        ({"question": "", "answer": "5", "level": 1}, "promptField: column 'question' holds ''"),
    ],
)
def test_a_record_without_a_mapped_column_is_refused_naming_it(record, says):
    with pytest.raises(MappingError) as error:
        mapped_row(record, MAPPING)
    assert says in str(error.value)
