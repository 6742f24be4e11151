# Copyright 2025 Huawei Technologies Co., Ltd. All Rights Reserved.
# Copyright 2025 The TransferQueue Team
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Ported to tqstore from Ascend/TransferQueue tests/test_client.py at commit b75d570d88c50bbfcbe2171baa727fadd7216f76.
# Changes: imports (transfer_queue -> tqstore) and setup only.  TransferQueue runs these tests against a
# mock ZMQ controller and mock storage units that answer with canned values; here the client is
# tqstore's, over a real in-process store, and the fixture puts into that store the state the mock
# controller's canned answers describe (partition "train_0" with rows 0-2 produced and consumed, the
# partitions the mock lists, rows in partition "0" for the fetches).  MockController / MockStorage
# remain as inert names the tests refer to.  Tests marked @pytest.mark.asyncio run through
# tests/compat/conftest.py (asyncio.run; pytest-asyncio is not a dependency).  Assertions unchanged.
# xfail marks: tests/compat/_xfails.py (reasons in docs/MIGRATING.md).

import time  # noqa: F401 - as the original
from threading import Thread  # noqa: F401 - as the original
from unittest.mock import patch  # noqa: F401 - as the original

import pytest
import torch
from tensordict import NonTensorStack, TensorDict  # noqa: F401 - as the original

import tqstore as tq
from tqstore import BatchMeta, TransferQueueClient  # noqa: F401 - TransferQueueClient as the original

TEST_DATA = TensorDict(
    {
        "log_probs": [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0]), torch.tensor([7.0, 8.0, 9.0])],
        "variable_length_sequences": torch.nested.as_nested_tensor(
            [
                torch.tensor([-0.5, -1.2, -0.8]),
                torch.tensor([-0.3, -1.5, -2.1, -0.9]),
                torch.tensor([-1.1, -0.7]),
            ],
            layout=torch.jagged,
        ),
        "prompt_text": ["Hello world!", "This is a longer sentence for testing", "Test case"],
    },
    batch_size=[3],
)


# ---- setup (tqstore): the mocks' names, inert; the store answers instead
class MockController:
    """Stands in for TransferQueue's mock ZMQ controller: tqstore's client talks to an in-process store."""

    def __init__(self, controller_id="controller_0"):
        self.controller_id = controller_id
        self.zmq_server_info = None

    def stop(self):
        pass


class MockStorage:
    """Stands in for TransferQueue's mock storage unit (the store's units hold the data)."""

    def __init__(self, storage_id="storage_0"):
        self.storage_id = storage_id
        self.zmq_server_info = None

    def stop(self):
        pass


def _state_of_the_mock_controller(client):
    """Put into the store what the mock controller's canned answers say it holds."""
    # GET_CONSUMPTION / GET_PRODUCTION: partition "train_0", global indexes 0-2, all produced and consumed
    client.put(TensorDict({"prompt_ids": torch.ones(3, 4, dtype=torch.int64),
                           "attention_mask": torch.ones(3, 4, dtype=torch.int64)}, batch_size=[3]),
               partition_id="train_0")
    client.get_meta(["prompt_ids", "attention_mask"], 3, "train_0", task_name="generate_sequences")
    # GET_LIST_PARTITIONS: these partitions exist
    for pid in ("partition_0", "partition_1", "test_partition"):
        client.put(TensorDict({"tokens": torch.zeros(1, 2, dtype=torch.int64)}, batch_size=[1]), partition_id=pid)
    # GET_META answers any fetch of partition "0" with rows: TEST_DATA's rows, and rows of the other fields asked
    client.put(TEST_DATA, partition_id="0")
    client.put(TensorDict({"tokens": torch.randint(0, 100, (12, 128)), "labels": torch.randint(0, 100, (12, 128)),
                           "input_ids": torch.randint(0, 100, (12, 128))}, batch_size=[12]), partition_id="0")


# Test Fixtures
@pytest.fixture
def mock_controller():
    controller = MockController()
    yield controller
    controller.stop()


@pytest.fixture
def mock_storage():
    storage = MockStorage()
    yield storage
    storage.stop()


@pytest.fixture
def client_setup(mock_controller, mock_storage, request):
    # tqstore: a fresh in-process store per test; TestClientKVInterface gets it empty (the mock numbers
    # each KV partition's keys from 0), the other tests get the mock controller's canned state
    tq.init()
    client = tq.get_client()
    if request.cls is None or request.cls.__name__ != "TestClientKVInterface":
        _state_of_the_mock_controller(client)
    yield client, mock_controller, mock_storage
    tq.close()


# Test basic functionality
def test_client_initialization(client_setup):
    """Test client initialization and connection setup"""
    client, mock_controller, mock_storage = client_setup

    assert client.client_id is not None
    assert client._controller is not None
    assert client._controller.id == mock_controller.controller_id


def test_put_and_get_data(client_setup):
    """Test basic put and get operations"""
    client, _, _ = client_setup

    # Test put operation
    client.put(data=TEST_DATA, partition_id="0")

    # Get metadata for retrieving data
    metadata = client.get_meta(
        data_fields=["log_probs", "variable_length_sequences", "prompt_text"], batch_size=2, partition_id="0"
    )

    # Test get operation
    result = client.get_data(metadata)

    # Verify result structure
    assert "log_probs" in result
    assert "variable_length_sequences" in result
    assert "prompt_text" in result

    torch.testing.assert_close(result["log_probs"][0], torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(result["log_probs"][1], torch.tensor([4.0, 5.0, 6.0]))
    torch.testing.assert_close(result["variable_length_sequences"][0], torch.tensor([-0.5, -1.2, -0.8]))
    torch.testing.assert_close(result["variable_length_sequences"][1], torch.tensor([-0.3, -1.5, -2.1, -0.9]))
    assert result["prompt_text"][0] == "Hello world!"
    assert result["prompt_text"][1] == "This is a longer sentence for testing"


def test_get_meta(client_setup):
    """Test metadata retrieval"""
    client, _, _ = client_setup

    # Test get_meta operation
    metadata = client.get_meta(data_fields=["tokens", "labels"], batch_size=10, partition_id="0")

    # Verify metadata structure
    assert hasattr(metadata, "global_indexes")
    assert hasattr(metadata, "field_names")
    assert hasattr(metadata, "size")
    assert len(metadata.global_indexes) == 10


# Test with single controller and multiple storage units
def test_single_controller_multiple_storages():
    """Test client with single controller and multiple storage units"""
    # Create single controller and multiple storage units
    controller = MockController("controller_0")
    storages = [MockStorage(f"storage_{i}") for i in range(3)]

    try:
        # tqstore: a store of 3 units in this process instead of a ZMQ controller and 3 storage actors
        tq.init({"num_units": 3})
        client = tq.get_client()

        # Verify controller is set
        assert client._controller is not None
        assert client._controller.id == controller.controller_id

        # Test basic operation
        test_data = TensorDict({"tokens": torch.randint(0, 100, (5, 128))}, batch_size=5)

        # Test put operation
        client.put(data=test_data, partition_id="0")

    finally:
        # Clean up
        controller.stop()
        for s in storages:
            s.stop()
        tq.close()  # tqstore


# Test error handling
def test_put_without_required_params(client_setup):
    """Test put operation without required parameters"""
    client, _, _ = client_setup

    # Create test data
    test_data = TensorDict({"tokens": torch.randint(0, 100, (5, 128))}, batch_size=5)

    # Test put without partition id (should fail)
    with pytest.raises(ValueError):
        client.put(data=test_data)


# Test new status checking methods
def test_check_consumption_status(client_setup):
    """Test consumption status checking"""
    client, _, _ = client_setup

    # Test synchronous check_consumption_status
    is_consumed = client.check_consumption_status(task_name="generate_sequences", partition_id="train_0")
    assert is_consumed is True


def test_check_production_status(client_setup):
    """Test production status checking"""
    client, _, _ = client_setup

    # Test synchronous check_production_status
    is_produced = client.check_production_status(data_fields=["prompt_ids", "attention_mask"], partition_id="train_0")
    assert is_produced is True


def test_get_consumption_status(client_setup):
    """Test get_consumption_status - returns global_index and consumption_status tensors"""
    client, _, _ = client_setup

    # Test synchronous get_consumption_status
    global_index, consumption_status = client.get_consumption_status(
        task_name="generate_sequences", partition_id="train_0"
    )

    # Verify return types
    assert global_index is not None
    assert consumption_status is not None

    # Verify global_index contains expected values
    assert torch.equal(global_index, torch.tensor([0, 1, 2], dtype=torch.long))

    # Verify consumption_status (mock returns all consumed)
    expected_status = torch.tensor([1, 1, 1], dtype=torch.int8)
    assert torch.equal(consumption_status, expected_status)

    print("✓ get_consumption_status returns correct global_index and consumption_status")


def test_get_production_status(client_setup):
    """Test get_production_status - returns global_index and production_status tensors"""
    client, _, _ = client_setup

    # Test synchronous get_production_status
    global_index, production_status = client.get_production_status(
        data_fields=["prompt_ids", "attention_mask"], partition_id="train_0"
    )

    # Verify return types
    assert global_index is not None
    assert production_status is not None

    # Verify global_index contains expected values
    assert torch.equal(global_index, torch.tensor([0, 1, 2], dtype=torch.long))

    # Verify production_status shape (mock returns 2x3 matrix)
    expected_status = torch.tensor([[1, 1, 1], [1, 1, 1]], dtype=torch.int8)
    assert torch.equal(production_status, expected_status)

    print("✓ get_production_status returns correct global_index and production_status")


def test_get_partition_list(client_setup):
    """Test partition list retrieval"""
    client, _, _ = client_setup

    # Test synchronous get_partition_list
    partition_list = client.get_partition_list()
    assert isinstance(partition_list, list)
    assert len(partition_list) > 0
    assert "partition_0" in partition_list
    assert "partition_1" in partition_list
    assert "test_partition" in partition_list


def test_reset_consumption(client_setup):
    """Test synchronous reset_consumption - resets consumption status for a partition"""
    client, _, _ = client_setup

    # Test synchronous reset_consumption with task_name
    success = client.reset_consumption(partition_id="train_0", task_name="generate_sequences")
    assert success is True

    print("✓ reset_consumption with task_name returns True")


def test_reset_consumption_all_tasks(client_setup):
    """Test synchronous reset_consumption without task_name (resets all tasks)"""
    client, _, _ = client_setup

    # Test synchronous reset_consumption without task_name (reset all tasks)
    success = client.reset_consumption(partition_id="train_0")
    assert success is True

    print("✓ reset_consumption without task_name (all tasks) returns True")


@pytest.mark.asyncio
async def test_async_reset_consumption(client_setup):
    """Test async reset_consumption - resets consumption status for a partition"""
    client, _, _ = client_setup

    # Test async_reset_consumption with task_name
    success = await client.async_reset_consumption(partition_id="train_0", task_name="generate_sequences")
    assert success is True

    print("✓ async_reset_consumption with task_name returns True")


@pytest.mark.asyncio
async def test_async_reset_consumption_all_tasks(client_setup):
    """Test async reset_consumption without task_name (resets all tasks)"""
    client, _, _ = client_setup

    # Test async_reset_consumption without task_name (reset all tasks)
    success = await client.async_reset_consumption(partition_id="train_0")
    assert success is True

    print("✓ async_reset_consumption without task_name (all tasks) returns True")


@pytest.mark.asyncio
async def test_async_check_consumption_status(client_setup):
    """Test async consumption status checking"""
    client, _, _ = client_setup

    # Test async_check_consumption_status
    is_consumed = await client.async_check_consumption_status(task_name="generate_sequences", partition_id="train_0")
    assert is_consumed is True


@pytest.mark.asyncio
async def test_async_check_production_status(client_setup):
    """Test async production status checking"""
    client, _, _ = client_setup

    # Test async_check_production_status
    is_produced = await client.async_check_production_status(
        data_fields=["prompt_ids", "attention_mask"], partition_id="train_0"
    )
    assert is_produced is True


@pytest.mark.asyncio
async def test_async_get_consumption_status(client_setup):
    """Test async get_consumption_status - returns global_index and consumption_status tensors"""
    client, _, _ = client_setup

    # Test async_get_consumption_status
    global_index, consumption_status = await client.async_get_consumption_status(
        task_name="generate_sequences", partition_id="train_0"
    )

    # Verify return types
    assert global_index is not None
    assert consumption_status is not None

    # Verify global_index contains expected values
    assert torch.equal(global_index, torch.tensor([0, 1, 2], dtype=torch.long))

    # Verify consumption_status (mock returns all consumed)
    expected_status = torch.tensor([1, 1, 1], dtype=torch.int8)
    assert torch.equal(consumption_status, expected_status)

    print("✓ async_get_consumption_status returns correct global_index and consumption_status")


@pytest.mark.asyncio
async def test_async_get_production_status(client_setup):
    """Test async get_production_status - returns global_index and production_status tensors"""
    client, _, _ = client_setup

    # Test async_get_production_status
    global_index, production_status = await client.async_get_production_status(
        data_fields=["prompt_ids", "attention_mask"], partition_id="train_0"
    )

    # Verify return types
    assert global_index is not None
    assert production_status is not None

    # Verify global_index contains expected values
    assert torch.equal(global_index, torch.tensor([0, 1, 2], dtype=torch.long))

    # Verify production_status shape (mock returns 2x3 matrix)
    expected_status = torch.tensor([[1, 1, 1], [1, 1, 1]], dtype=torch.int8)
    assert torch.equal(production_status, expected_status)

    print("✓ async_get_production_status returns correct global_index and production_status")


@pytest.mark.asyncio
async def test_async_get_partition_list(client_setup):
    """Test async partition list retrieval"""
    client, _, _ = client_setup

    # Test async_get_partition_list
    partition_list = await client.async_get_partition_list()
    assert isinstance(partition_list, list)
    assert len(partition_list) > 0
    assert "partition_0" in partition_list
    assert "partition_1" in partition_list
    assert "test_partition" in partition_list


# Test clear methods
@pytest.mark.asyncio
async def test_async_clear_partition(client_setup):
    """Test async clear partition operation"""
    client, _, _ = client_setup

    # Test async_clear_partition
    await client.async_clear_partition(partition_id="test_partition")

    # If no exception is raised, the test passes
    assert True


@pytest.mark.asyncio
async def test_async_clear_samples(client_setup):
    """Test async clear samples operation"""
    client, _, _ = client_setup

    # First get metadata to create a BatchMeta object
    metadata = await client.async_get_meta(data_fields=["tokens", "labels"], batch_size=2, partition_id="0")

    # Test async_clear_samples
    await client.async_clear_samples(metadata=metadata)

    # If no exception is raised, the test passes
    assert True


def test_clear_partition(client_setup):
    """Test synchronous clear partition operation"""
    client, _, _ = client_setup

    # Test synchronous clear_partition
    client.clear_partition(partition_id="test_partition")

    # If no exception is raised, the test passes
    assert True


def test_clear_samples(client_setup):
    """Test synchronous clear samples operation"""
    client, _, _ = client_setup

    # First get metadata to create a BatchMeta object
    metadata = client.get_meta(data_fields=["tokens", "labels"], batch_size=2, partition_id="0")

    # Test synchronous clear_samples
    client.clear_samples(metadata=metadata)

    # If no exception is raised, the test passes
    assert True


@pytest.mark.asyncio
async def test_async_clear_samples_with_empty_metadata(client_setup):
    """Test async_clear_samples with empty BatchMeta"""
    client, _, _ = client_setup

    # Create empty BatchMeta
    metadata = BatchMeta(global_indexes=[], partition_ids=[], field_schema={})

    # The clear operation should complete without raising an exception
    # because the mock storage manager is configured to handle this
    await client.async_clear_samples(metadata=metadata)

    # If no exception is raised, the test passes
    assert True


@pytest.mark.asyncio
async def test_sync_methods_work_in_async_event_loop(client_setup):
    """Test all synchronous methods can be called from within an asyncio event loop.

    This test verifies that the sync methods can be called directly from an async
    function without causing "asyncio.run() cannot be called from a running loop" errors.
    """
    client, _, _ = client_setup

    test_data = TensorDict({"tokens": torch.randint(0, 100, (3, 64))}, batch_size=3)

    # Test sync put
    metadata = client.put(data=test_data, partition_id="0")
    assert metadata is not None

    # Test sync get_meta - use fields that mock returns
    metadata = client.get_meta(
        data_fields=["log_probs", "variable_length_sequences", "prompt_text"], batch_size=2, partition_id="0"
    )
    assert metadata is not None
    assert len(metadata.global_indexes) == 2

    # Test sync get_data - verify we get the expected fields from mock
    result = client.get_data(metadata)
    assert result is not None
    assert "log_probs" in result
    assert "prompt_text" in result

    # Test sync check_consumption_status
    is_consumed = client.check_consumption_status(task_name="generate_sequences", partition_id="train_0")
    assert isinstance(is_consumed, bool)

    # Test sync get_consumption_status
    global_index, consumption_status = client.get_consumption_status(
        task_name="generate_sequences", partition_id="train_0"
    )
    assert global_index is not None
    assert consumption_status is not None

    # Test sync check_production_status
    is_produced = client.check_production_status(data_fields=["log_probs", "prompt_text"], partition_id="train_0")
    assert isinstance(is_produced, bool)

    # Test sync get_production_status
    global_index, production_status = client.get_production_status(
        data_fields=["log_probs", "prompt_text"], partition_id="train_0"
    )
    assert global_index is not None
    assert production_status is not None

    # Test sync get_partition_list
    partition_list = client.get_partition_list()
    assert isinstance(partition_list, list)
    assert len(partition_list) > 0

    # Test sync clear_partition
    client.clear_partition(partition_id="test_partition")

    # Test sync clear_samples
    metadata = client.get_meta(data_fields=["log_probs", "prompt_text"], batch_size=2, partition_id="0")
    client.clear_samples(metadata=metadata)

    print("✓ All sync methods work correctly when called from within asyncio event loop")


@pytest.mark.asyncio
async def test_sync_and_async_methods_mixed_usage(client_setup):
    """Test mixing sync and async method calls within the same async context.

    This test verifies that async methods and sync methods can be used interchangeably
    without conflicts when called from an async function.
    """
    client, _, _ = client_setup

    test_data = TensorDict({"tokens": torch.randint(0, 100, (2, 32))}, batch_size=2)

    # Call sync method first
    sync_put_result = client.put(data=test_data, partition_id="0")
    assert sync_put_result is not None

    # Call async method
    async_metadata = await client.async_get_meta(data_fields=["tokens"], batch_size=2, partition_id="0")
    assert async_metadata is not None

    # Call sync method again
    sync_get_meta_result = client.get_meta(data_fields=["tokens"], batch_size=2, partition_id="0")
    assert sync_get_meta_result is not None

    # Call async method
    async_data = await client.async_get_data(sync_get_meta_result)
    assert async_data is not None

    print("✓ Mixed async and sync method calls work correctly")


# =====================================================
# Custom Meta Interface Tests
# =====================================================


class TestClientCustomMetaInterface:
    """Tests for client custom_meta interface methods."""

    def test_set_custom_meta_sync(self, client_setup):
        """Test synchronous set_custom_meta method."""
        client, _, _ = client_setup

        # Test synchronous set_custom_meta

        # First get metadata
        metadata = client.get_meta(data_fields=["input_ids"], batch_size=2, partition_id="0")
        # Set custom_meta on the metadata
        metadata.update_custom_meta(
            [
                {"input_ids": {"token_count": 100}},
                {"input_ids": {"token_count": 120}},
            ]
        )

        # Call set_custom_meta with metadata (BatchMeta)
        client.set_custom_meta(metadata)
        print("✓ set_custom_meta sync method works")

    @pytest.mark.asyncio
    async def test_set_custom_meta_async(self, client_setup):
        """Test asynchronous async_set_custom_meta method."""
        client, _, _ = client_setup

        # First get metadata
        metadata = await client.async_get_meta(data_fields=["input_ids"], batch_size=2, partition_id="0")
        # Set custom_meta on the metadata
        metadata.update_custom_meta(
            [
                {"input_ids": {"token_count": 100}},
                {"input_ids": {"token_count": 120}},
            ]
        )

        # Call async_set_custom_meta with metadata (BatchMeta)
        await client.async_set_custom_meta(metadata)
        print("✓ async_set_custom_meta async method works")


# =====================================================
# KV Interface Tests
# =====================================================


class TestClientKVInterface:
    """Tests for client KV interface methods."""

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_meta_single(self, client_setup):
        """Test async_kv_retrieve_meta with single key."""
        client, _, _ = client_setup

        # Test async_kv_retrieve_meta with single key
        metadata = await client.async_kv_retrieve_meta(
            keys="test_key_1",
            partition_id="test_partition",
            create=True,
        )

        # Verify metadata structure
        assert metadata is not None
        assert hasattr(metadata, "global_indexes")
        assert hasattr(metadata, "size")
        assert metadata.size == 1

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_meta_multiple(self, client_setup):
        """Test async_kv_retrieve_meta with multiple keys."""
        client, _, _ = client_setup

        # Test async_kv_retrieve_meta with multiple keys
        keys = ["key_a", "key_b", "key_c"]
        metadata = await client.async_kv_retrieve_meta(
            keys=keys,
            partition_id="test_partition",
            create=True,
        )

        # Verify metadata structure
        assert metadata is not None
        assert hasattr(metadata, "global_indexes")
        assert hasattr(metadata, "size")
        assert metadata.size == 3

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_meta_create_false(self, client_setup):
        """Test async_kv_retrieve_meta with create=False (retrieve existing keys)."""
        client, _, _ = client_setup

        # create some keys
        await client.async_kv_retrieve_meta(
            keys="existing_key",
            partition_id="existing_partition",
            create=True,
        )

        # Then retrieve them with create=False
        metadata = await client.async_kv_retrieve_meta(
            keys="existing_key",
            partition_id="existing_partition",
            create=False,
        )

        # Verify metadata structure
        assert metadata is not None
        assert metadata.size == 1

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_meta_invalid_keys_type(self, client_setup):
        """Test async_kv_retrieve_meta raises error with invalid keys type."""
        client, _, _ = client_setup

        # Test with invalid keys type (not string or list)
        with pytest.raises(TypeError):
            await client.async_kv_retrieve_meta(
                keys=123,  # Invalid type
                partition_id="test_partition",
                create=True,
            )

    @pytest.mark.asyncio
    async def test_async_kv_list_with_keys(self, client_setup):
        """Test async_kv_list returns keys after they are registered."""
        client, mock_controller, _ = client_setup

        # First register some keys
        await client.async_kv_retrieve_meta(
            keys=["key_1", "key_2"],
            partition_id="kv_partition",
            create=True,
        )

        # Then list them
        partition_info = await client.async_kv_list(partition_id="kv_partition")

        # Verify keys are returned
        assert len(partition_info["kv_partition"]) >= 2
        assert "key_1" in partition_info["kv_partition"]
        assert "key_2" in partition_info["kv_partition"]
        assert list(partition_info["kv_partition"].values()) == [{}, {}]

    @pytest.mark.asyncio
    async def test_async_kv_list_multiple_partitions(self, client_setup):
        """Test async_kv_list with multiple partitions."""
        client, _, _ = client_setup

        # Create keys in different partitions
        await client.async_kv_retrieve_meta(
            keys="partition_a_key",
            partition_id="partition_a",
            create=True,
        )
        await client.async_kv_retrieve_meta(
            keys="partition_b_key",
            partition_id="partition_b",
            create=True,
        )

        # List keys for each partition
        partition_a = await client.async_kv_list(partition_id="partition_a")
        partition_b = await client.async_kv_list(partition_id="partition_b")

        # Verify keys are isolated per partition
        assert "partition_a" in partition_a
        assert "partition_b" in partition_b
        assert "partition_a" not in partition_b
        assert "partition_b" not in partition_a
        assert "partition_a_key" in partition_a["partition_a"]
        assert "partition_b_key" not in partition_a["partition_a"]
        assert "partition_b_key" in partition_b["partition_b"]
        assert "partition_a_key" not in partition_b["partition_b"]
        assert list(partition_a["partition_a"].values()) == [{}]
        assert list(partition_b["partition_b"].values()) == [{}]

    def test_kv_retrieve_meta_type_validation(self, client_setup):
        """Test synchronous kv_retrieve_meta type validation."""
        import asyncio

        client, _, _ = client_setup

        # Test with non-string element in list
        async def test_invalid_list():
            with pytest.raises(TypeError):
                await client.async_kv_retrieve_meta(
                    keys=["valid_key", 123],  # Invalid: 123 is not a string
                    partition_id="test_partition",
                    create=True,
                )

        asyncio.run(test_invalid_list())

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_single(self, client_setup):
        """Test async_kv_retrieve_keys with single global_index."""
        client, _, _ = client_setup
        partition_id = "test_partition_idx"

        # First create a key using kv_retrieve_meta
        await client.async_kv_retrieve_meta(
            keys=["test_key"],
            partition_id=partition_id,
            create=True,
        )

        # Now retrieve the key using global_index 0
        keys = await client.async_kv_retrieve_keys(
            global_indexes=[0],
            partition_id=partition_id,
        )

        assert keys == ["test_key"]

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_multiple(self, client_setup):
        """Test async_kv_retrieve_keys with multiple global_indexes."""
        client, _, _ = client_setup
        partition_id = "test_partition_idx"

        # First create keys using kv_retrieve_meta
        keys_to_create = ["key_a", "key_b", "key_c"]
        await client.async_kv_retrieve_meta(
            keys=keys_to_create,
            partition_id=partition_id,
            create=True,
        )

        # Retrieve keys using global_indexes [0, 1, 2]
        keys = await client.async_kv_retrieve_keys(
            global_indexes=[0, 1, 2],
            partition_id=partition_id,
        )

        assert keys == ["key_a", "key_b", "key_c"]

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_partial(self, client_setup):
        """Test async_kv_retrieve_keys with subset of global_indexes."""
        client, _, _ = client_setup
        partition_id = "test_partition_idx"

        # First create keys using kv_retrieve_meta
        await client.async_kv_retrieve_meta(
            keys=["first_key", "second_key", "third_key"],
            partition_id=partition_id,
            create=True,
        )

        # Retrieve only first and third keys
        keys = await client.async_kv_retrieve_keys(
            global_indexes=[0, 2],
            partition_id=partition_id,
        )

        assert keys == ["first_key", "third_key"]

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_single_int(self, client_setup):
        """Test async_kv_retrieve_keys accepts a single int."""
        client, _, _ = client_setup
        partition_id = "test_partition_idx"

        # First create a key using kv_retrieve_meta
        await client.async_kv_retrieve_meta(
            keys=["single_key"],
            partition_id=partition_id,
            create=True,
        )

        # Now retrieve the key using a single int (not a list)
        keys = await client.async_kv_retrieve_keys(
            global_indexes=0,
            partition_id=partition_id,
        )

        assert keys == ["single_key"]

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_invalid_type(self, client_setup):
        """Test async_kv_retrieve_keys raises error with invalid global_indexes type."""
        client, _, _ = client_setup

        # Test with invalid type (string instead of int)
        with pytest.raises(TypeError):
            await client.async_kv_retrieve_keys(
                global_indexes=["not_an_int"],
                partition_id="test_partition",
            )

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_empty_list(self, client_setup):
        """Test async_kv_retrieve_keys raises error with empty list."""
        client, _, _ = client_setup

        with pytest.raises(ValueError):
            await client.async_kv_retrieve_keys(
                global_indexes=[],
                partition_id="test_partition",
            )

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_non_existent(self, client_setup):
        """Test async_kv_retrieve_keys returns None for non-existent global_indexes."""
        client, _, _ = client_setup
        partition_id = "test_partition_idx"

        # First create a key using kv_retrieve_meta
        await client.async_kv_retrieve_meta(
            keys=["existing_key"],
            partition_id=partition_id,
            create=True,
        )

        # Try to retrieve a non-existent global_index
        keys = await client.async_kv_retrieve_keys(
            global_indexes=[99],
            partition_id=partition_id,
        )
        assert keys == [None]

    @pytest.mark.asyncio
    async def test_async_kv_retrieve_keys_multiple_partitions(self, client_setup):
        """Test async_kv_retrieve_keys returns keys from the correct partition."""
        client, _, _ = client_setup
        partition_1 = "partition_1"
        partition_2 = "partition_2"

        # Create keys in both partitions
        await client.async_kv_retrieve_meta(
            keys=["key_1"],
            partition_id=partition_1,
            create=True,
        )
        await client.async_kv_retrieve_meta(
            keys=["key_2"],
            partition_id=partition_2,
            create=True,
        )

        # Retrieve key from partition_1 (global_index 0)
        keys_1 = await client.async_kv_retrieve_keys(
            global_indexes=[0],
            partition_id=partition_1,
        )

        # Retrieve key from partition_2 (global_index 0)
        keys_2 = await client.async_kv_retrieve_keys(
            global_indexes=[0],
            partition_id=partition_2,
        )

        assert keys_1 == ["key_1"]
        assert keys_2 == ["key_2"]

    def test_kv_retrieve_keys_sync(self, client_setup):
        """Test synchronous kv_retrieve_keys."""
        client, _, _ = client_setup
        partition_id = "test_partition_sync"

        # First create a key using kv_retrieve_meta
        client.kv_retrieve_meta(
            keys=["sync_key"],
            partition_id=partition_id,
            create=True,
        )

        # Now retrieve the key using global_index
        keys = client.kv_retrieve_keys(
            global_indexes=[0],
            partition_id=partition_id,
        )

        assert keys == ["sync_key"]

    def test_kv_retrieve_keys_type_validation(self, client_setup):
        """Test synchronous kv_retrieve_keys type validation."""
        client, _, _ = client_setup

        # Test with non-int element in list
        with pytest.raises(TypeError):
            client.kv_retrieve_keys(
                global_indexes=[0, "invalid"],
                partition_id="test_partition",
            )


# =====================================================
# Checkpoint Interface Tests
# =====================================================


class TestClientCheckpointInterface:
    """Tests for client save/load checkpoint interface methods."""

    def test_save_controller_checkpoint_sync(self, client_setup, tmp_path):
        """Synchronous save_controller_checkpoint sends correct request."""
        client, _, _ = client_setup
        ckpt_path = str(tmp_path / "controller.pkl")

        # Should not raise — mock controller acknowledges the request
        client.save_controller_checkpoint(ckpt_path)

    def test_load_controller_checkpoint_sync(self, client_setup, tmp_path):
        """Synchronous load_controller_checkpoint sends correct request."""
        client, _, _ = client_setup
        ckpt_path = str(tmp_path / "controller.pkl")

        client.load_controller_checkpoint(ckpt_path)

    @pytest.mark.asyncio
    async def test_async_save_controller_checkpoint(self, client_setup, tmp_path):
        """Async save_controller_checkpoint sends correct request."""
        client, _, _ = client_setup
        ckpt_path = str(tmp_path / "controller_async.pkl")

        await client.async_save_controller_checkpoint(ckpt_path)

    @pytest.mark.asyncio
    async def test_async_load_controller_checkpoint(self, client_setup, tmp_path):
        """Async load_controller_checkpoint sends correct request."""
        client, _, _ = client_setup
        ckpt_path = str(tmp_path / "controller_async.pkl")

        await client.async_load_controller_checkpoint(ckpt_path)

    def test_save_storage_checkpoint_sync(self, client_setup, tmp_path):
        """Synchronous save_storage_checkpoint delegates to storage manager."""
        client, _, _ = client_setup
        ckpt_dir = str(tmp_path / "storage_ckpt")

        called_with = []

        async def mock_save_checkpoint(directory):
            called_with.append(directory)

        client.storage_manager.save_checkpoint = mock_save_checkpoint
        client.save_storage_checkpoint(ckpt_dir)
        assert called_with == [ckpt_dir]

    def test_load_storage_checkpoint_sync(self, client_setup, tmp_path):
        """Synchronous load_storage_checkpoint delegates to storage manager."""
        client, _, _ = client_setup
        ckpt_dir = str(tmp_path / "storage_ckpt")

        called_with = []

        async def mock_load_checkpoint(directory):
            called_with.append(directory)

        client.storage_manager.load_checkpoint = mock_load_checkpoint
        client.load_storage_checkpoint(ckpt_dir)
        assert called_with == [ckpt_dir]

    @pytest.mark.asyncio
    async def test_async_save_storage_checkpoint(self, client_setup, tmp_path):
        """Async save_storage_checkpoint delegates to storage manager."""
        client, _, _ = client_setup
        ckpt_dir = str(tmp_path / "storage_ckpt_async")

        called_with = []

        async def mock_save_checkpoint(directory):
            called_with.append(directory)

        client.storage_manager.save_checkpoint = mock_save_checkpoint
        await client.async_save_storage_checkpoint(ckpt_dir)
        assert called_with == [ckpt_dir]

    @pytest.mark.asyncio
    async def test_async_load_storage_checkpoint(self, client_setup, tmp_path):
        """Async load_storage_checkpoint delegates to storage manager."""
        client, _, _ = client_setup
        ckpt_dir = str(tmp_path / "storage_ckpt_async")

        called_with = []

        async def mock_load_checkpoint(directory):
            called_with.append(directory)

        client.storage_manager.load_checkpoint = mock_load_checkpoint
        await client.async_load_storage_checkpoint(ckpt_dir)
        assert called_with == [ckpt_dir]

    def test_save_storage_checkpoint_without_manager(self, mock_controller, tmp_path):
        """save_storage_checkpoint raises RuntimeError if storage manager not initialized."""
        client = TransferQueueClient(
            client_id="no_storage_client",
            controller_info=mock_controller.zmq_server_info,
        )
        ckpt_dir = str(tmp_path / "should_fail")

        with pytest.raises(RuntimeError, match="Storage manager not initialized"):
            client.save_storage_checkpoint(ckpt_dir)

    def test_load_storage_checkpoint_without_manager(self, mock_controller, tmp_path):
        """load_storage_checkpoint raises RuntimeError if storage manager not initialized."""
        client = TransferQueueClient(
            client_id="no_storage_client2",
            controller_info=mock_controller.zmq_server_info,
        )
        ckpt_dir = str(tmp_path / "should_fail")

        with pytest.raises(RuntimeError, match="Storage manager not initialized"):
            client.load_storage_checkpoint(ckpt_dir)
