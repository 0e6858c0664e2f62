"""The config room: the YAML file in, one frozen, validated LakefeedConfig out (model, its sources,
and the watch that reloads it when the file changes).
"""
