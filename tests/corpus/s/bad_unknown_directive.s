.include "other.s"
    end
