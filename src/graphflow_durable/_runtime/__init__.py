"""The AutoGen adapter: the durable manager, the participant container, the run session and
the link between them. The only home of ``autogen_agentchat.teams._group_chat``.
"""
