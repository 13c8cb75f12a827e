/* gw_engine.c -- fixture: gateway/ reaches into engine/ (rule "gateway"), both forms. */
#include "engine/tasks.h"
#include "../engine/engine.h"
