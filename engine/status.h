#pragma once
#include "common/status.h"
