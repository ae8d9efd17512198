"""Crashes its process with a segmentation fault.
EXPECT screen=REWARD_HACK runtime=RUNTIME_ERROR"""
import ctypes


def run(hidden_states, weight):
    ctypes.string_at(0)
